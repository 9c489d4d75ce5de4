"""SSH to the provider's hosts on asyncssh (to each host's ``address``, as KubeKey does; it defaults to
``internalAddress``): parallel sessions under a concurrency limit, timeouts,
host keys trusted on first use and recorded in the work dir (a changed key is an error), sudo when
the login user is not root, and the output of every command kept per host."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import shlex
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from sxwl.ctl.cluster import Host

DEFAULT_CONCURRENCY = 64
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 120.0

T = TypeVar("T")


class SshFailure(Exception):
    """A host could not be reached or logged into; the message says what to fix."""


class HostKeyChanged(SshFailure):
    pass


@dataclass
class RunResult:
    host: str
    command: str
    exit_status: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # could not connect, log in or finish; exit_status is None then

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status == 0

    def why(self) -> str:
        if self.error is not None:
            return self.error
        detail = (self.stderr.strip() or self.stdout.strip()).splitlines()
        tail = detail[-1] if detail else "no output"
        return f"exited {self.exit_status}: {tail}"


def fingerprint(key: asyncssh.SSHKey) -> str:
    digest = hashlib.sha256(key.public_data).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_pattern(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


@dataclass
class KnownHosts:
    """Trust on first use, in OpenSSH known_hosts format (``ssh -o UserKnownHostsFile=`` reads it)."""

    path: Path
    _keys: dict[str, list[tuple[int, asyncssh.SSHKey]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.path.exists():
            return
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            parts = line.split()
            if len(parts) < 3 or line.startswith("#"):
                continue
            try:
                key = asyncssh.import_public_key(f"{parts[1]} {parts[2]}")
            except (asyncssh.KeyImportError, ValueError):
                continue
            self._keys.setdefault(parts[0], []).append((number, key))

    def trusted(self, address: str, port: int) -> list[asyncssh.SSHKey]:
        return [key for _, key in self._keys.get(host_pattern(address, port), [])]

    def recorded_line(self, address: str, port: int) -> int | None:
        entries = self._keys.get(host_pattern(address, port))
        return entries[0][0] if entries else None

    def record(self, address: str, port: int, key: asyncssh.SSHKey) -> None:
        pattern = host_pattern(address, port)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{pattern} {key.export_public_key('openssh').decode().strip()}\n"
        with self.path.open("a") as handle:
            handle.write(line)
        number = len(self.path.read_text().splitlines())
        self._keys.setdefault(pattern, []).append((number, key))


class _TofuClient(asyncssh.SSHClient):
    def __init__(self, known: KnownHosts, host: Host) -> None:
        self.known = known
        self.host = host
        self.changed: tuple[str, str, int | None] | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        recorded = self.known.trusted(self.host.address, self.host.port)
        if recorded:  # known host and not one of its keys: refuse
            self.changed = (
                ", ".join(fingerprint(k) for k in recorded),
                fingerprint(key),
                self.known.recorded_line(self.host.address, self.host.port),
            )
            return False
        self.known.record(self.host.address, self.host.port, key)
        return True


def describe_failure(host: Host, exc: BaseException, key_path: Path | None, timeout: float) -> str:
    where = f"{host.user}@{host.address}:{host.port}"
    if isinstance(exc, HostKeyChanged):
        return str(exc)
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {host.address}:{host.port}: is sshd running, and is the port right?"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return (
            f"unreachable: no SSH answer from {host.address}:{host.port} within {timeout:g}s; "
            "check the address, the network and the firewall"
        )
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host.address}: use an IP address or fix DNS / /etc/hosts"
    if isinstance(exc, asyncssh.PermissionDenied):
        if key_path is not None:
            return (
                f"{where} refused the key {key_path}: run `3kctl ssh setup` to install it, "
                "or correct privateKeyPath / user"
            )
        return f"{where} refused the password: check the `password` of this host"
    if isinstance(exc, asyncssh.KeyImportError):
        return f"cannot use the private key {key_path}: {exc} (3kctl needs a key without a passphrase)"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"{where} closed the connection: {exc.reason}"
    if isinstance(exc, OSError):
        return f"unreachable: {host.address}:{host.port}: {exc.strerror or exc}"
    return f"{where}: {type(exc).__name__}: {exc}"


def sudo_wrap(host: Host, command: str) -> str:
    """Runs ``command`` as root: directly for root, else through ``sudo -n`` (no password prompt)."""
    if host.is_root:
        return command
    return f"sudo -n -- sh -c {shlex.quote(command)}"


class SshPool:
    """Connections to many hosts, one per host, reused by every command of one pool's lifetime."""

    def __init__(
        self,
        known_hosts: KnownHosts,
        concurrency: int = DEFAULT_CONCURRENCY,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ) -> None:
        self.known = known_hosts
        self.concurrency = max(1, concurrency)
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._limit = asyncio.Semaphore(self.concurrency)
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.results: dict[str, list[RunResult]] = {}  # every command's output, per host

    async def __aenter__(self) -> SshPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()

    async def connect(self, host: Host, password: str | None = None) -> asyncssh.SSHClientConnection:
        lock = self._locks.setdefault(host.name, asyncio.Lock())
        async with lock:
            if password is None and host.name in self._conns:
                return self._conns[host.name]
            conn = await self._open(host, password)
            if password is None:
                self._conns[host.name] = conn
            return conn

    async def _open(self, host: Host, password: str | None) -> asyncssh.SSHClientConnection:
        client = _TofuClient(self.known, host)
        trusted = self.known.trusted(host.address, host.port)
        options: dict[str, Any] = {
            "username": host.user,
            "port": host.port,
            "known_hosts": (trusted, [], []),
            "agent_path": None,
            "config": [],
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": 30,
        }
        if password is not None:
            options.update(
                password=password, client_keys=[], preferred_auth=["password", "keyboard-interactive"]
            )
        else:
            options.update(client_keys=[str(host.private_key_path)] if host.private_key_path else [])
            options.update(password=None, preferred_auth=["publickey"])
        if not trusted:
            options["server_host_key_algs"] = "default"
        try:
            conn, _ = await asyncio.wait_for(
                asyncssh.create_connection(lambda: client, host.address, **options),
                self.connect_timeout + 5,
            )
        except asyncssh.HostKeyNotVerifiable:
            if client.changed is None:
                raise
            was, now, line = client.changed
            raise HostKeyChanged(
                f"HOST KEY CHANGED for {host.name} ({host.address}:{host.port}): recorded {was} "
                f"(line {line} of {self.known.path}), now offers {now}. If this server was reinstalled, "
                f"delete that line and run again; otherwise someone may be intercepting the connection"
            ) from None
        return conn

    async def run(
        self,
        host: Host,
        command: str,
        *,
        sudo: bool = True,
        input: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - per command, applied with wait_for
        password: str | None = None,
        shown: str | None = None,
    ) -> RunResult:
        """Runs one command; never raises for host problems: they are in ``RunResult.error``.
        ``shown`` replaces the command in the kept output (for commands that carry secrets)."""
        full = sudo_wrap(host, command) if sudo else command
        result = RunResult(host=host.name, command=shown or command)
        limit = timeout or self.command_timeout
        async with self._limit:
            try:
                conn = await self.connect(host, password)
                try:
                    done = await asyncio.wait_for(conn.run(full, input=input, check=False), limit)
                finally:
                    if password is not None:
                        conn.close()
                result.exit_status = done.exit_status if done.exit_status is not None else -1
                result.stdout = _text(done.stdout)
                result.stderr = _text(done.stderr)
                if not host.is_root and sudo and "sudo: a password is required" in result.stderr:
                    result.error = (
                        f"{host.user} may not use sudo without a password on {host.name}: add "
                        f"`{host.user} ALL=(ALL) NOPASSWD: ALL` to /etc/sudoers.d/3kctl there (or log "
                        "in as root)"
                    )
            except TimeoutError:
                if result.exit_status is None and host.name in self._conns:
                    result.error = f"timed out after {limit:g}s: {shown or command}"
                else:
                    result.error = describe_failure(
                        host, TimeoutError(), host.private_key_path, self.connect_timeout
                    )
            except (OSError, asyncssh.Error, SshFailure, asyncssh.KeyImportError) as exc:
                result.error = describe_failure(
                    host, exc, None if password else host.private_key_path, self.connect_timeout
                )
                self._conns.pop(host.name, None)
        self.results.setdefault(host.name, []).append(result)
        return result

    async def read_file(self, host: Host, path: str) -> RunResult:
        return await self.run(host, f"cat {shlex.quote(path)}")

    async def each(self, hosts: Iterable[Host], work: Callable[[Host], Awaitable[T]]) -> dict[str, T]:
        """Runs ``work`` for every host at once (the semaphore limits open sessions)."""
        hosts = list(hosts)
        values = await asyncio.gather(*(work(h) for h in hosts))
        return {h.name: v for h, v in zip(hosts, values, strict=True)}

    async def run_all(
        self, hosts: Iterable[Host], command: str | Callable[[Host], str], *, sudo: bool = True
    ) -> dict[str, RunResult]:
        def text(host: Host) -> str:
            return command(host) if callable(command) else command

        return await self.each(hosts, lambda h: self.run(h, text(h), sudo=sudo))


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def run_sync(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())
