"""The engine image's Dockerfile (deploy/docker/engine.Dockerfile) installs the versions the
project pins elsewhere: vLLM at the version the agent asks for, transformers at the training stack's.
It cannot be built here (no Docker engine), so its pins are read and compared."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from sxwl.protocol.endpoints import VLLM_VERSION

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "docker" / "engine.Dockerfile"


def _arg(name: str) -> str:
    found = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert found is not None, f"{DOCKERFILE.name} has no ARG {name}"
    return found.group(1)


def test_the_engine_image_pins_what_the_project_pins() -> None:
    assert _arg("VLLM_VERSION") == VLLM_VERSION
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert f"transformers=={_arg('TRANSFORMERS_VERSION')}" in train
    assert _arg("ENGINE") == "vllm"  # GPUs unless told otherwise
    ignore = (ROOT / "deploy" / "docker" / "engine.Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*") :] == ["*", "!pyproject.toml", "!README.md", "!src", "src/**/__pycache__"]
