"""What a CPod has: nodes, CPUs, memory and GPUs."""
