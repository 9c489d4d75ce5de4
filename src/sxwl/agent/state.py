"""The agent's state dir: this machine's cluster_uid and the CPod token (mode 0600)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

REGISTRATION_FILE = "cpod.json"


def machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return socket.gethostname()


def local_cluster_uid(state_dir: Path) -> str:
    """Stable for one machine and one state dir: a restarted agent comes back as the same CPod, and
    two agents with separate state dirs on one machine are separate CPods."""
    digest = hashlib.sha256(f"{machine_id()}\0{state_dir.resolve()}".encode()).hexdigest()
    return f"local-{digest[:32]}"


@dataclass(frozen=True)
class SavedRegistration:
    api_url: str
    cpod_id: str
    cpod_token: str
    cluster_uid: str


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def ensure(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)

    def load(self, api_url: str, cluster_uid: str) -> SavedRegistration | None:
        """The saved registration, if it is for this cloud and this cluster."""
        try:
            saved = SavedRegistration(**json.loads((self.path / REGISTRATION_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return saved if saved.api_url == api_url and saved.cluster_uid == cluster_uid else None

    def save(self, registration: SavedRegistration) -> None:
        self.ensure()
        target = self.path / REGISTRATION_FILE
        temp = target.with_suffix(".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(registration), handle)
        os.replace(temp, target)  # never a half-written token file
