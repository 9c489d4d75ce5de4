"""An agent that can dial out and accept nothing (docs/endpoints.md, "Tests"), as a CPod behind NAT.

``python outbound_only.py SOCKET PORT -- ARGV...`` runs in a fresh network namespace that has only its
loopback (``unshare --net``): no address of it is reachable from anywhere else, so nothing can
connect into it. Inside, 127.0.0.1:PORT leads out through the unix socket SOCKET (the file system is
shared) to a relay the test runs outside, which connects to the cloud: ARGV (the agent) dials the
cloud at http://127.0.0.1:PORT and every byte between them goes out through that one door.
Standard library only."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _splice(a: socket.socket, b: socket.socket) -> None:
    threads = [threading.Thread(target=_pipe, args=pair, daemon=True) for pair in ((a, b), (b, a))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    a.close()
    b.close()


def serve(listener: socket.socket, connect: object) -> None:
    """Each accepted connection spliced to a new one from ``connect()``."""
    while True:
        try:
            accepted, _ = listener.accept()
        except OSError:
            return
        try:
            outward = connect()  # type: ignore[operator]
        except OSError:
            accepted.close()
            continue
        threading.Thread(target=_splice, args=(accepted, outward), daemon=True).start()


class Relay:
    """The test's side: SOCKET → the cloud at 127.0.0.1:PORT."""

    def __init__(self, path: Path, port: int) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        connect = lambda: socket.create_connection(("127.0.0.1", port))  # noqa: E731
        threading.Thread(target=serve, args=(self.listener, connect), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def main(argv: list[str]) -> int:
    path, port, sep, *command = argv
    assert sep == "--"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    listener = socket.create_server(("127.0.0.1", int(port)))

    def outward() -> socket.socket:
        door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        door.connect(path)
        return door

    threading.Thread(target=serve, args=(listener, outward), daemon=True).start()
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
