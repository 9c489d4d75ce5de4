"""算力详情: the CPods, their GPUs and what runs on them."""
