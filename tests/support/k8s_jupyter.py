"""The dev environment image of the tests' real nodes: Debian's python3 with this machine's
JupyterLab (the ``devenv`` extra) and what it requires, added as one layer as the trainer image is
(tests/support/k8s_trainer.py), with JupyterLab's application files where Debian's python3 looks
for them (``sys.prefix/share/jupyter/lab``). No sxwl: the agent hands the pod its identity provider.

Also this machine's OpenSSH server, which the test dependencies install (the base image is built
without it, and rebuilding that base would stop every other test until it is built again): ``sshd``
and ``ssh-keygen`` under /opt/sxwl-ssh with the libraries they link but glibc's (this machine and
the base are the same Debian release, so its glibc serves them), run by two scripts at the paths
the pod uses (``/usr/sbin/sshd``, ``ssh-keygen`` on PATH) with those libraries on
LD_LIBRARY_PATH for them alone: the image's python3 keeps its own, and sshd gives its sessions an
environment of its own making."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes
from tests.support.k8s_trainer import site_files

JUPYTER_IMAGE = "sxwl.test/jupyter:1"
SSH_DIR = "/opt/sxwl-ssh"
SSH_PROGRAMS = {"/usr/sbin/sshd": "/usr/sbin/sshd", "/usr/bin/ssh-keygen": "/usr/bin/ssh-keygen"}
# glibc's own libraries: the image has them, of the same release.
GLIBC = (
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libresolv.so",
    "libutil.so",
    "ld-linux",
)


def jupyter_image(nodes: RealNodes) -> str:
    files = site_files(("jupyterlab",))
    files["/usr/share/jupyter/lab"] = Path(sys.prefix) / "share" / "jupyter" / "lab"
    files |= ssh_files(nodes.root / "ssh-image")
    return nodes.image_with_files(PYTHON_IMAGE, JUPYTER_IMAGE, files)


def ssh_files(scratch: Path) -> dict[str, Path]:
    """{path in the image: path here} of the OpenSSH server: its programs, their libraries and the
    two scripts that run them (written to ``scratch``)."""
    scratch.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for where, program in SSH_PROGRAMS.items():
        name = Path(program).name
        files[f"{SSH_DIR}/{name}"] = Path(program)
        for library in _libraries(program):
            files[f"{SSH_DIR}/lib/{library.name}"] = library.resolve()  # the file, under its soname
        script = scratch / name
        script.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={SSH_DIR}/lib exec {SSH_DIR}/{name} "$@"\n')
        script.chmod(0o755)
        files[where] = script
    return files


def _libraries(program: str) -> list[Path]:
    """The shared libraries ``program`` links on this machine, as ldd resolves them, but glibc's."""
    listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    found = []
    for line in listed.splitlines():
        parts = line.split()
        linked = len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/")
        if linked and not parts[0].startswith(GLIBC):
            found.append(Path(parts[2]))
    return found
