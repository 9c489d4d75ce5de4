"""A stand-in for the cloud's agent routes that fine-tunes' inputs use (the input route, status
reports) and for an object store on another origin, each a real HTTP server on loopback: the
requests they saw are recorded, so tests see which credential went where."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sxwl.protocol.finetune import InputName, JobInput

JOB = "0" * 32


@dataclass
class Served:
    """What a server answers per path, and the requests it saw (path, Authorization header)."""

    bodies: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""
    reports: list[dict[str, Any]] = field(default_factory=list)  # the status reports, in order
    # Paths whose answer stops after its first byte until the event is set (a fetch in progress).
    held: dict[str, threading.Event] = field(default_factory=dict)


@pytest.fixture
def servers() -> Iterator[tuple[Served, Served]]:
    """The "cloud" (answers inputs, or redirects them) and the "store" on another port."""
    made: list[ThreadingHTTPServer] = []
    states = (Served(), Served())
    for state in states:

        class Handler(BaseHTTPRequestHandler):
            served = state

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                self.served.seen.append((self.path, self.headers.get("Authorization")))
                if path in self.served.redirects:
                    self.send_response(307)
                    self.send_header("Location", self.served.redirects[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.served.bodies.get(path)
                if body is None:
                    payload = b'{"error": {"code": "not_found", "message": "no such input"}}'
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                hold = self.served.held.get(path)
                if hold is not None:
                    self.wfile.write(body[:1])
                    self.wfile.flush()
                    hold.wait(30)
                    body = body[1:]
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                report = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0].endswith("/status"):  # not a command's ack
                    self.served.reports.append(report)
                payload = json.dumps({"state": report.get("state", "")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
    yield states
    for server in made:
        server.shutdown()
        server.server_close()


def input_path(name: str) -> str:
    return f"/api/v1/agent/jobs/{JOB}/inputs/{name}"


def job_input(name: InputName, data: bytes, archive: bool = False) -> JobInput:
    return JobInput(name=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data), archive=archive)


def tar_of(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buffer.getvalue()
