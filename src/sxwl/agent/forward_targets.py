"""What a tunnel stream may be forwarded to besides the ``--tunnel-allow`` list (docs/tunnel.md): a
service of one attempt the agent itself started, found by the runtime from the stream's target.

- ``SocketTarget``: a Unix socket in the attempt's own dir on this machine (the local runtime's
  dev environments and engines). The attempt owns that dir and could put a link there to any
  socket on the machine, so the server that answers must run as the attempt's uid (SO_PEERCRED).
- ``TcpTarget``: an address of the attempt's pod (the Kubernetes runtime), which a NetworkPolicy
  keeps to the agent's own pod.

``raw``: no HTTP, the stream's bytes both ways (an sshd)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SocketTarget:
    """A Unix socket of one attempt: the socket's dir, its name in it, and the uid its server must
    run as."""

    directory: Path
    name: str
    uid: int
    raw: bool = False

    @classmethod
    def at(cls, path: str | Path, uid: int, raw: bool = False) -> SocketTarget:
        path = Path(path)
        return cls(path.parent, path.name, uid, raw)


@dataclass(frozen=True)
class TcpTarget:
    """A TCP address of one attempt's pod."""

    host: str
    port: int
    raw: bool = False


Target = SocketTarget | TcpTarget
# Which attempt's service a stream's target names (the runtime's lookup); None: not such a target.
Targets = Callable[[str], Target | None]


async def open_target(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connects to ``target``; OSError when it cannot be reached or is served by someone else."""
    if isinstance(target, TcpTarget):
        return await asyncio.open_connection(target.host, target.port)
    return await _open_socket(target)


async def _open_socket(target: SocketTarget) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Nothing is sent unless the answering server runs as the attempt's uid. The dir is reached
    through a descriptor: the socket's path on the machine may be longer than a socket address
    holds."""
    fd = os.open(target.directory, os.O_PATH | os.O_DIRECTORY)
    try:
        reader, writer = await asyncio.open_unix_connection(f"/proc/self/fd/{fd}/{target.name}")
    finally:
        os.close(fd)
    sock = writer.get_extra_info("socket")
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != target.uid:
        writer.transport.abort()
        raise OSError(f"its socket is served by uid {uid}, not the attempt's")
    return reader, writer
