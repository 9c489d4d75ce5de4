"""Which machine a compiled file is for, from its ELF header: the artifact's programs (bin/) and the
compiled parts inside its 3kctl must all be for the target's (``--arch``), which a cross-build could
otherwise get wrong unseen until a provider's host refuses to run them."""

from __future__ import annotations

import zipfile
from pathlib import Path

# ELF e_machine values of the targets an artifact is built for, as Go names them.
MACHINES = {62: "amd64", 183: "arm64"}


def arch_of(header: bytes) -> str | None:
    """The Go architecture of a 64-bit ELF header's e_machine; None for anything else."""
    if len(header) < 20 or header[:4] != b"\x7fELF" or header[4] != 2:
        return None
    machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return MACHINES.get(machine, f"ELF machine {machine}")


def file_arch(path: Path) -> str | None:
    with path.open("rb") as handle:
        return arch_of(handle.read(20))


def zip_arches(path: Path) -> dict[str, str]:
    """{member: architecture} of the compiled members of a zip (the 3kctl zipapp's lib/)."""
    found: dict[str, str] = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if member.endswith(".so") or ".so." in member.rsplit("/", 1)[-1]:
                with archive.open(member) as handle:
                    arch = arch_of(handle.read(20))
                if arch is not None:
                    found[member] = arch
    return found
