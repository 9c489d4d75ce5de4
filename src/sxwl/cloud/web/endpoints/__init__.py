"""推理服务 (Endpoints): deploy a model, see and delete endpoints, and the inference keys."""
