"""The artifact for another machine (`make artifact ARTIFACT_ARGS="--arch arm64"`, docs/artifact.md
"Building"), as far as an x86_64 machine with no network goes: the build's own `go build` cross-compiles
a program for linux/arm64 (aarch64 in its ELF header and for `file`), and the build's checks of what
it packs say which machine a program or one of 3kctl's compiled parts is for. The whole arm64 build,
with the real kubectl and helm and 3kctl from aarch64 wheels, needs the package index and minutes of
compiling: `make artifact ARTIFACT_ARGS="--arch arm64"`, whose result docs/artifact.md records."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sxwl.artifactbuild.elf import arch_of, file_arch, zip_arches
from sxwl.artifactbuild.gobins import go_build
from sxwl.ctl import zipapp

MAIN = 'package main\n\nimport "os"\n\nfunc main() { os.Stdout.WriteString("hello\\n") }\n'
FILE_SAYS = {"arm64": "ARM aarch64", "amd64": "x86-64"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Go program built by the build's go_build for each machine."""
    root = tmp_path_factory.mktemp("go-hello")
    (root / "go.mod").write_text("module example.com/hello\n\ngo 1.26\n")
    (root / "main.go").write_text(MAIN)
    built: dict[str, Path] = {}
    for arch in ("arm64", "amd64"):
        target = root / "out" / f"hello-linux-{arch}"
        assert go_build(root, ".", [], target, arch) is None
        built[arch] = target
    return built


def test_go_programs_cross_compile_for_arm64(programs: dict[str, Path]) -> None:
    for arch, program in programs.items():
        assert file_arch(program) == arch
        if shutil.which("file"):
            described = subprocess.run(["file", str(program)], capture_output=True, text=True, check=True)
            assert FILE_SAYS[arch] in described.stdout and "statically linked" in described.stdout
    assert not list(programs["arm64"].parent.glob(".*.partial"))
    ran = subprocess.run([str(programs["amd64"])], capture_output=True, text=True, check=True)
    assert ran.stdout == "hello\n"
    # This x86_64 machine cannot run the arm64 one (no emulator registered): it is not for it.
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return
    with pytest.raises(OSError):
        subprocess.run([str(programs["arm64"])], capture_output=True, check=False)


def test_elf_headers_name_the_machine_and_nothing_else(tmp_path: Path, programs: dict[str, Path]) -> None:
    assert arch_of(b"#!/usr/bin/env python3\n") is None
    assert arch_of(b"\x7fELF\x01" + bytes(15)) is None  # 32-bit
    riscv = bytearray(programs["amd64"].read_bytes()[:20])
    riscv[18:20] = (243).to_bytes(2, "little")
    assert arch_of(bytes(riscv)) == "ELF machine 243"
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    assert file_arch(script) is None


def test_the_3kctl_zipapps_compiled_parts_are_for_this_machine(
    tmp_path: Path, programs: dict[str, Path]
) -> None:
    """The zipapp built from this venv (as `make artifact` without --arch does) carries compiled
    parts, all for this machine; one for another machine is named by the member that is."""
    built = zipapp.build(tmp_path / "3kctl")
    arches = zip_arches(built)
    assert any("_cffi_backend" in member for member in arches), arches
    assert set(arches.values()) == {"amd64"}
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("lib/_cffi_backend.cpython-311-aarch64-linux-gnu.so", programs["arm64"].read_bytes())
        archive.writestr("lib/cffi/__init__.py", "")
    assert zip_arches(foreign) == {"lib/_cffi_backend.cpython-311-aarch64-linux-gnu.so": "arm64"}
