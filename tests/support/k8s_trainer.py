"""The trainer image of the tests' real nodes: what deploy/docker/trainer.Dockerfile builds, made
offline from this machine's own packages. The Debian test image has the same CPython (3.11), so the
test environment's installed distributions of the training stack (torch, transformers, peft and
what they require) and the project's source are added as one layer to
``/usr/local/lib/python3.11/dist-packages``, which Debian's python3 reads first. Of NVIDIA's CUDA
wheels only the libraries that importing torch maps go in (about half of their 3 GB: torch's CUDA
build links them at import, GPU or not), and triton stays out: the nodes have no GPU."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement

from tests.support.k8s import REPO
from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes

TRAINER_IMAGE = "sxwl.test/trainer:1"
DIST_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
# What the trainer imports: the `train` extra of pyproject.toml, and pydantic for sxwl.protocol.
ROOTS = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "tokenizers",
    "huggingface-hub",
    "pydantic",
)
LEFT_OUT = re.compile(r"^(nvidia-.*|triton|cuda-.*)$")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(roots: tuple[str, ...] = ROOTS) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` need, by normalised name (GPU-only ones left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _key(todo.pop())
        if name in found or LEFT_OUT.match(name):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency of some environment marker's: not installed here
        found[name] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def site_files(roots: tuple[str, ...]) -> dict[str, Path]:
    """{path in the image: path here}: the top-level entries of each distribution ``roots`` need."""
    site = Path(sysconfig.get_paths()["purelib"])
    tops = {
        file.parts[0]
        for dist in distributions(roots).values()
        for file in dist.files or []
        if file.parts and file.parts[0] != ".."  # scripts in bin/: the image's programs run none
    }
    return {f"{DIST_PACKAGES}/{top}": site / top for top in sorted(tops) if (site / top).exists()}


def trainer_files(roots: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """{path in the image: path here}: each distribution's top-level entries, and ``sxwl``."""
    site = Path(sysconfig.get_paths()["purelib"])
    files = site_files(roots)
    for library in cuda_libraries(site):
        files[f"{DIST_PACKAGES}/{library.relative_to(site).as_posix()}"] = library
    files[f"{DIST_PACKAGES}/sxwl"] = REPO / "src" / "sxwl"
    return files


# What a process that imports the training stack has mapped of NVIDIA's wheels, one path a line.
_MAPPED = (
    "import torch, transformers, peft\n"
    "paths = {line.split()[-1] for line in open('/proc/self/maps') if '/nvidia/' in line}\n"
    "print('\\n'.join(sorted(paths)))\n"
)


def cuda_libraries(site: Path) -> list[Path]:
    """The NVIDIA libraries of ``site`` that importing torch loads (found through torch's RPATH)."""
    done = subprocess.run(
        [sys.executable, "-c", _MAPPED], capture_output=True, text=True, timeout=300, check=True
    )
    found = [Path(line) for line in done.stdout.splitlines() if line.startswith(f"{site}/nvidia/")]
    return [path for path in found if path.is_file()]


def trainer_image(nodes: RealNodes) -> str:
    return nodes.image_with_files(PYTHON_IMAGE, TRAINER_IMAGE, trainer_files())
