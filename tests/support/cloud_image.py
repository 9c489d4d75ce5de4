"""The cloud's image for the real test nodes (tests/k8s/test_cloud_chart.py), built offline: the Debian
base `sxwl.test/python:1` plus, as one layer, the project's source and the installed distributions the
cloud runs on (the closure of the project's dependencies, without those only the agent and 3kctl use),
copied from this virtualenv into Debian's /usr/local dist-packages, and a `sxwl` launcher.
deploy/docker/cloud.Dockerfile is the production image; this one holds the same packages."""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement

from tests.support.k8s import REPO
from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes

CLOUD_IMAGE = "sxwl.test/cloud:1"
# Debian's python3 has this on sys.path, so the image needs no PYTHONPATH.
DIST_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
# The agent's and 3kctl's: the cloud never imports them (docs/architecture.md, "Dependencies").
NOT_THE_CLOUDS = frozenset({"kubernetes-asyncio", "asyncssh", "nvidia-ml-py"})
LAUNCHER = "#!/usr/bin/python3\nimport sys\n\nfrom sxwl.cli.main import main\n\nsys.exit(main())\n"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": extra}) for extra in extras | {""})


def cloud_distributions() -> list[importlib.metadata.Distribution]:
    """The installed distributions `sxwl` needs at run time, less the agent's and 3kctl's."""
    wanted = [Requirement(r) for r in importlib.metadata.requires("sxwl") or []]
    todo = [r for r in wanted if _applies(r, set()) and _name(r.name) not in NOT_THE_CLOUDS]
    found: dict[str, importlib.metadata.Distribution] = {}
    taken: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement = todo.pop()
        key = (_name(requirement.name), frozenset(requirement.extras))
        if key in taken:
            continue
        taken.add(key)
        dist = found.setdefault(key[0], importlib.metadata.distribution(key[0]))
        needs = [Requirement(r) for r in dist.requires or []]
        todo += [r for r in needs if _applies(r, set(requirement.extras))]
    return sorted(found.values(), key=lambda d: _name(d.metadata["Name"]))


def _top_level_entries(dist: importlib.metadata.Distribution) -> set[str]:
    """The names directly in site-packages that `dist` installed (its packages, modules, bundled
    libraries and dist-info); scripts outside site-packages are left out."""
    return {
        file.parts[0]
        for file in dist.files or []
        if file.parts and file.parts[0] != ".." and file.parts[0] != "__pycache__"
    }


def cloud_image_files(launcher: Path) -> dict[str, Path]:
    site = Path(sysconfig.get_paths()["purelib"])
    files = {f"{DIST_PACKAGES}/sxwl": REPO / "src" / "sxwl", "/usr/local/bin/sxwl": launcher}
    for dist in cloud_distributions():
        for entry in _top_level_entries(dist):
            files[f"{DIST_PACKAGES}/{entry}"] = site / entry
    return files


def cloud_image(nodes: RealNodes, work: Path) -> str:
    """Builds (cached by content) and imports the cloud's test image into every real node."""
    launcher = work / "sxwl"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    return nodes.image_with_files(PYTHON_IMAGE, CLOUD_IMAGE, cloud_image_files(launcher))
