"""The engine image of the tests' real nodes: the trainer image (tests/support/k8s_trainer.py) plus,
as one more layer, what ``transformers serve`` needs besides the training stack, its ``serving``
extra (FastAPI, uvicorn, the openai types, rich), from this machine's own packages. It serves the
tiny Llama on the nodes' CPUs as a CPU CPod's engine image would (docs/agent.md, "Endpoints on
Kubernetes"). Layered on the trainer image, not beside it: the nodes' containerds keep the training
stack's layer once for both (a copy of its own was some 8 GB more on disk across the two nodes)."""

from __future__ import annotations

from tests.support.k8s_node import RealNodes
from tests.support.k8s_trainer import TRAINER_IMAGE, site_files, trainer_image

ENGINE_IMAGE = "sxwl.test/engine:1"
SERVING = ("openai", "uvicorn", "fastapi", "starlette", "rich")


def engine_image(nodes: RealNodes) -> str:
    if not nodes.has_image(TRAINER_IMAGE):
        trainer_image(nodes)
    return nodes.image_with_files(TRAINER_IMAGE, ENGINE_IMAGE, site_files(SERVING))
