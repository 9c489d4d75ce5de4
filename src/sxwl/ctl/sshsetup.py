"""``3kctl ssh setup``: step 1 of the guide. Creates the key pair if missing and installs its public
key on every host, logging in once with a password that is never stored or logged."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from sxwl.ctl.cluster import ClusterConfig, Host
from sxwl.ctl.ssh import SshPool

# Appends the key read from stdin unless present; idempotent, and keeps the files' modes strict.
INSTALL_SCRIPT = (
    'umask 077; key=$(cat); mkdir -p "$HOME/.ssh"; touch "$HOME/.ssh/authorized_keys"; '
    'grep -qxF "$key" "$HOME/.ssh/authorized_keys" || printf "%s\\n" "$key" >> "$HOME/.ssh/authorized_keys"; '
    'chmod 700 "$HOME/.ssh"; chmod 600 "$HOME/.ssh/authorized_keys"'
)


@dataclass
class SetupResult:
    host: str
    status: str  # "already trusted" | "installed" | "failed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def ensure_key_pair(path: Path) -> tuple[bool, str]:
    """Returns (created, public key line). RSA when the file name says so (id_rsa), else Ed25519."""
    pub = path.with_name(path.name + ".pub")
    if path.exists():
        key = asyncssh.read_private_key(str(path))
        line = key.export_public_key("openssh").decode().strip()
        if not pub.exists():
            pub.write_text(line + "\n")
        return False, line
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    alg = "ssh-rsa" if "rsa" in path.name else "ssh-ed25519"
    key = asyncssh.generate_private_key(
        alg, comment="3kctl", **({"key_size": 4096} if alg == "ssh-rsa" else {})
    )
    data = key.export_private_key("openssh")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    line = key.export_public_key("openssh").decode().strip()
    pub.write_text(line + "\n")
    return True, line


def hosts_needing_password(config: ClusterConfig) -> list[Host]:
    return [h for h in config.hosts if h.password is None]


async def setup_host(pool: SshPool, host: Host, public_key: str, password: str | None) -> SetupResult:
    probe = await pool.run(host, "true", sudo=False, timeout=30)
    if probe.ok:
        return SetupResult(host.name, "already trusted", "the key already logs in")
    if probe.error and (
        "HOST KEY CHANGED" in probe.error or probe.error.startswith(("unreachable", "connection"))
    ):
        return SetupResult(host.name, "failed", probe.error)
    secret = host.password if host.password is not None else password
    if secret is None:
        return SetupResult(host.name, "failed", f"{probe.why()}; and no password was given for it")
    installed = await pool.run(
        host, f"sh -c {shlex.quote(INSTALL_SCRIPT)}", sudo=False, input=public_key + "\n", password=secret
    )
    if not installed.ok:
        return SetupResult(host.name, "failed", installed.why())
    check = await pool.run(host, "true", sudo=False, timeout=30)
    if not check.ok:
        return SetupResult(
            host.name,
            "failed",
            f"the key was added to ~{host.user}/.ssh/authorized_keys but still does not log in: "
            f"{check.why()} "
            "(is PubkeyAuthentication off in the host's sshd_config?)",
        )
    return SetupResult(host.name, "installed", f"added to ~{host.user}/.ssh/authorized_keys")
