"""Where the agent keeps its CPod token: the state dir of a local CPod (``cpod.json``, mode 0600, and
this machine's cluster_uid), or a Secret on a Kubernetes CPod."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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


TOKEN_SECRET = "sxwl-agent-token"  # noqa: S105 - the Secret's name


class SecretState:
    """The CPod token of a Kubernetes CPod, in the Secret ``sxwl-agent-token`` of the agent's
    namespace, with the fields of ``cpod.json``: every replica of the agent, and the pod that replaces
    a deleted one, find it there. The same ``load``/``save`` as ``StateDir``, awaited. Needs secrets
    get, create and update in that namespace, nothing cluster-wide."""

    def __init__(self, api: Any, namespace: str, name: str = TOKEN_SECRET) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    async def load(self, api_url: str, cluster_uid: str) -> SavedRegistration | None:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            secret = await client.CoreV1Api(self.api).read_namespaced_secret(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            fields = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
            saved = SavedRegistration(
                api_url=fields["api_url"],
                cpod_id=fields["cpod_id"],
                cpod_token=fields["cpod_token"],
                cluster_uid=fields["cluster_uid"],
            )
        except (KeyError, ValueError):
            return None
        return saved if saved.api_url == api_url and saved.cluster_uid == cluster_uid else None

    async def save(self, registration: SavedRegistration) -> None:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        core = client.CoreV1Api(self.api)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "sxwl-agent"},
            },
            "type": "Opaque",
            "data": {k: base64.b64encode(str(v).encode()).decode() for k, v in asdict(registration).items()},
        }
        try:
            await core.create_namespaced_secret(self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            await core.replace_namespaced_secret(self.name, self.namespace, body)
