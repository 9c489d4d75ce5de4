"""The work dir (``.3kctl/`` beside the config, or ``--work-dir``): known host keys, step logs,
the deploy ledger and generated files. Nothing secret is written here except the fetched
kubeconfig (mode 0600)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkDir:
    root: Path

    @classmethod
    def for_config(cls, config_path: Path, override: Path | None = None) -> WorkDir:
        root = override if override is not None else config_path.resolve().parent / ".3kctl"
        return cls(root.resolve())

    def ensure(self) -> WorkDir:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs.mkdir(exist_ok=True, mode=0o700)
        return self

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def ledger(self) -> Path:
        return self.root / "state.json"

    @property
    def kubekey_config(self) -> Path:
        return self.root / "kubekey-cluster.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def write_private(self, path: Path, data: bytes) -> None:
        """Writes a file created 0600 from the start (never readable by others, not even briefly)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, 0o600)
