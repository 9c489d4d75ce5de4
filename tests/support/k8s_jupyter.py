"""The dev environment image of the tests' real nodes: Debian's python3 with this machine's
JupyterLab (the ``devenv`` extra) and what it requires, added as one layer as the trainer image is
(tests/support/k8s_trainer.py), with JupyterLab's application files where Debian's python3 looks
for them (``sys.prefix/share/jupyter/lab``). No sxwl: the agent hands the pod its identity provider."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes
from tests.support.k8s_trainer import site_files

JUPYTER_IMAGE = "sxwl.test/jupyter:1"


def jupyter_image(nodes: RealNodes) -> str:
    files = site_files(("jupyterlab",))
    files["/usr/share/jupyter/lab"] = Path(sys.prefix) / "share" / "jupyter" / "lab"
    return nodes.image_with_files(PYTHON_IMAGE, JUPYTER_IMAGE, files)
