"""The engine image of the tests' real nodes: the trainer image's files (tests/support/k8s_trainer.py)
plus what ``transformers serve`` needs besides the training stack, its ``serving`` extra (FastAPI,
uvicorn, the openai types, rich), from this machine's own packages. It serves the tiny Llama on the
nodes' CPUs as a CPU CPod's engine image would (docs/agent.md, "Endpoints on Kubernetes")."""

from __future__ import annotations

from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes
from tests.support.k8s_trainer import ROOTS, trainer_files

ENGINE_IMAGE = "sxwl.test/engine:1"
SERVING = ("openai", "uvicorn", "fastapi", "starlette", "rich")


def engine_image(nodes: RealNodes) -> str:
    return nodes.image_with_files(PYTHON_IMAGE, ENGINE_IMAGE, trainer_files((*ROOTS, *SERVING)))
