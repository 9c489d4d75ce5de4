"""Loopback SSH hosts for 3kctl tests: Debian's sshd bound to 127.0.0.N, one process per host,
each with its own host key, hostname (UTS namespace), /etc/machine-id and /sys/module (mount
namespace), started and stopped through its pid."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port

SSHD = "/usr/sbin/sshd"


def have_sshd() -> bool:
    return os.path.exists(SSHD) and shutil.which("unshare") is not None and os.geteuid() == 0


def keygen(path: Path, kind: str = "ed25519") -> Path:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".pub").unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "3kctl-test", "-f", str(path)], check=True
    )
    path.chmod(0o600)
    return path


@dataclass
class SshdHost:
    name: str
    address: str
    root: Path
    authorized_key: Path | None  # public key accepted from the start (None: none)
    modules: tuple[str, ...] = ("overlay", "br_netfilter")
    hostname: str | None = None  # default: name
    password_auth: bool = False
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.address)
        self.host_key = self.root / "ssh_host_ed25519_key"
        if not self.host_key.exists():
            keygen(self.host_key)
        (self.root / "machine-id").write_text(secrets.token_hex(16) + "\n")
        sysmod = self.root / "sys-module"
        sysmod.mkdir(exist_ok=True)
        for module in self.modules:
            (sysmod / module).mkdir(exist_ok=True)
        keys = self.root / "authorized_keys"
        keys.write_text(
            self.authorized_key.with_name(self.authorized_key.name + ".pub").read_text()
            if self.authorized_key
            else ""
        )

    @property
    def log(self) -> str:
        path = self.root / "sshd.log"
        return path.read_text() if path.exists() else ""

    def config_text(self) -> str:
        return "\n".join(
            [
                f"ListenAddress {self.address}:{self.port}",
                f"HostKey {self.host_key}",
                f"PidFile {self.root / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.root / 'authorized_keys'} .ssh/authorized_keys",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin yes",
                f"PasswordAuthentication {'yes' if self.password_auth else 'no'}",
                "KbdInteractiveAuthentication no",
                "MaxStartups 200:30:400",
                "MaxSessions 100",
                "LogLevel VERBOSE",
                "",
            ]
        )

    def start(self) -> SshdHost:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        config = self.root / "sshd_config"
        config.write_text(self.config_text())
        script = (
            f"hostname {self.hostname or self.name} && "
            f"mount --bind {self.root / 'machine-id'} /etc/machine-id && "
            f"mount --bind {self.root / 'sys-module'} /sys/module && "
            f"exec {SSHD} -D -e -f {config}"
        )
        log = (self.root / "sshd.log").open("ab")
        self.proc = subprocess.Popen(
            ["unshare", "--uts", "--mount", "sh", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd {self.name} exited: {self.log}")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd {self.name} not listening: {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def new_host_key(self) -> None:
        """The server was 'reinstalled': a new host key, same address and port."""
        self.stop()
        keygen(self.host_key)
        self.start()

    def line(self, key: Path | None, user: str = "root", **extra: object) -> str:
        fields = {
            "name": self.name,
            "internalAddress": self.address,
            "port": self.port,
            "user": user,
            **({"privateKeyPath": str(key)} if key else {}),
            **extra,
        }
        return "  - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"


def config_text(
    hosts: list[SshdHost],
    key: Path | None,
    *,
    control_plane: list[str] | None = None,
    workers: list[str] | None = None,
    extra: str = "",
    user: str = "root",
) -> str:
    names = [h.name for h in hosts]
    cps = control_plane or names[:1]
    workers = workers if workers is not None else (names[1:] or names[:1])
    lines = ["hosts:", *(h.line(key, user) for h in hosts), "roleGroups:"]
    lines += ["  etcd:", *(f"    - {n}" for n in cps), "  control-plane:", *(f"    - {n}" for n in cps)]
    lines += ["  worker:", *(f"    - {n}" for n in workers), "  registry:", f"    - {cps[0]}"]
    return "\n".join(lines) + "\n" + extra
