from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.ctl.hosts import SshdHost, have_sshd, keygen

_addresses = itertools.count(2)


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_ctl(
    *args: str, env: dict[str, str] | None = None, input: str | None = None, cwd: Path | None = None
) -> Result:
    """Runs the real ``3kctl`` (as ``python -m sxwl.ctl``) and returns its exit status and output."""
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SXWL_3KCTL_") and k not in ("SXWL_ACCESS_KEY", "SXWL_API_URL")
    }
    full_env.update({"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", **(env or {})})
    proc = subprocess.run(
        [sys.executable, "-m", "sxwl.ctl", *args],
        env=full_env,
        input=input,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return keygen(tmp_path_factory.mktemp("keys") / "id_ed25519")


MakeHosts = Callable[..., list[SshdHost]]


@pytest.fixture
def make_hosts(tmp_path: Path, ssh_key: Path) -> Iterator[MakeHosts]:
    if not have_sshd():
        pytest.skip(
            "needs root, /usr/sbin/sshd and unshare (scripts/install-test-deps.sh installs openssh-server)"
        )
    started: list[SshdHost] = []

    def make(names: list[str], start: bool = True, **kwargs: Any) -> list[SshdHost]:
        hosts = []
        for name in names:
            kwargs.setdefault("authorized_key", ssh_key)
            host = SshdHost(
                name, f"127.0.0.{next(_addresses) % 250 + 2}", tmp_path / "hosts" / name, **kwargs
            )
            started.append(host)
            hosts.append(host.start() if start else host)
        return hosts

    yield make
    for host in started:
        host.stop()


REPO = Path(__file__).resolve().parents[2]


def make_artifact(root: Path) -> Path:
    """An unpacked artifact with the real manifest and small stand-in files, checksums filled."""
    import yaml

    from sxwl.ctl.artifact import write_checksums

    root.mkdir(parents=True, exist_ok=True)
    text = (REPO / "deploy" / "artifact" / "manifest.yaml").read_text()
    (root / "manifest.yaml").write_text(text)
    data = yaml.safe_load(text)
    paths = [t["path"] for t in data["tools"]] + [data["kubernetes"]["kubekeyArtifact"]]
    paths += [c["path"] for c in data["charts"] + data["ceph"]]
    paths += [a["path"] for a in data["imageArchives"]]
    for relative in paths:
        file = root / relative
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(f"stand-in for {relative}\n".encode())
    write_checksums(root)
    return root


def packed_artifact(folder: Path) -> Path:
    """``folder/3k-artifact.tgz``: make_artifact's files packed as the build packs them."""
    from sxwl.artifactbuild.pack import tar_gz

    output = folder / "3k-artifact.tgz"
    tar_gz(make_artifact(folder / "src" / "artifact"), output, "artifact")
    return output


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return make_artifact(tmp_path / "artifact")
