"""The CPod's input cache served to its own pods (docs/agent.md, "The input cache on Kubernetes").

On a Kubernetes CPod the agent fetches a fine-tune's inputs into its cache (inputs.py, the archives
left packed) before it creates the attempt's Job, and serves them over HTTP inside the cluster; the
pod's fetcher (pod_fetcher.py) asks here first and falls back to the cloud. So a base model that an
earlier fine-tune brought leaves the cloud once per CPod, and the heartbeat's cache report lets the
scheduler prefer this CPod for the next job that needs it.

Who may read what: ``GET /v1/inputs/{job_id}/{attempt}/{sha256}`` answers only an attempt the agent
granted (input_grants.py, when it started the attempt), only with the bearer credential derived
from that attempt's upload token (``pod_fetcher.cache_credential``: the upload token itself never
travels here), and only for a sha256 among that attempt's inputs. A tenant's pod therefore reads
nothing another attempt brought, even knowing its sha256. Grants live in memory: after an agent
restart the pods of earlier attempts are refused here and fetch from the cloud, which checks them
again."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Generator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from sxwl.agent.input_grants import InputGrants
from sxwl.agent.inputs import InputCache
from sxwl.agent.pod_fetcher import CACHE_PATH
from sxwl.agent.pod_settings import listen_address
from sxwl.protocol import SHA256_HEADER

log = logging.getLogger("sxwl.agent.cache_server")
SHA256_HEX = set("0123456789abcdef")


def _error(status: int, code: str, message: str) -> JSONResponse:
    """The cloud's error body, so the fetcher and people read both alike."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def input_app(cache: InputCache, grants: InputGrants) -> Starlette:
    async def serve(request: Request) -> Response:
        job_id, sha256 = request.path_params["job_id"], request.path_params["sha256"]
        attempt: int = request.path_params["attempt"]
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if len(sha256) != 64 or not SHA256_HEX.issuperset(sha256):
            return _error(404, "not_found", "sha256 must be 64 lowercase hex digits")
        if scheme.lower() != "bearer" or not grants.permits(job_id, attempt, credential.strip(), sha256):
            return _error(403, "forbidden", "this attempt may not read that input here")
        path = await asyncio.to_thread(cache.held_file, sha256)
        if path is None:
            return _error(404, "not_found", "not in the CPod's cache")
        return FileResponse(path, media_type="application/octet-stream", headers={SHA256_HEADER: sha256})

    route = CACHE_PATH.replace("{attempt}", "{attempt:int}")
    return Starlette(routes=[Route(route, serve, methods=["GET"])])


class _Server(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """The agent's own handlers stop it (and this server with it): none of uvicorn's."""
        yield


class CacheServer:
    """The agent's listening socket for its pods (``--serve-inputs``) and the grants it answers by."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.grants = InputGrants()

    @classmethod
    def from_flags(
        cls, address: str, url: str | None, runtime: str, fetching: bool
    ) -> tuple[CacheServer, str]:
        """The server of ``--serve-inputs`` and its URL for pods (``--inputs-url``, else the
        address's); ``fetching``: the CPod runs work whose pods fetch inputs (an image for
        fine-tunes, endpoint replicas or dev environments is set). ValueError names the flag and
        the fix."""
        if runtime != "kubernetes" or not fetching:
            raise ValueError(
                "--serve-inputs serves inputs to a Kubernetes CPod's pods: it needs --runtime "
                "kubernetes and one of --trainer-image, --engine-image or --dev-env-image (a local "
                "CPod's jobs read the cache directly)"
            )
        try:
            host, port = listen_address(address)
        except ValueError as exc:
            raise ValueError(f"--serve-inputs {address}: {exc}") from None
        if url is None and host in ("0.0.0.0", "::"):  # noqa: S104 - refusing it as the pods' address
            raise ValueError(f"--serve-inputs {address}: give --inputs-url, the address pods reach")
        try:
            server = cls.bind(host, port)
        except OSError as exc:
            raise ValueError(f"--serve-inputs {address}: cannot listen: {exc.strerror or exc}") from None
        shown = f"[{host}]" if ":" in host else host
        return server, (url or f"http://{shown}:{port}").rstrip("/")

    @classmethod
    def bind(cls, host: str, port: int) -> CacheServer:
        """Bound before the agent registers, so a port that is taken fails its start (OSError). It
        listens only once ``run`` serves: until then (a replica that is not the leader, say) pods
        are refused at once and fetch from the cloud instead of waiting on a queue nobody takes."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        return cls(sock)

    async def run(self, cache: InputCache, stop: asyncio.Event) -> None:
        """Serves until ``stop`` is set; requests under way get uvicorn's graceful end."""
        config = uvicorn.Config(
            input_app(cache, self.grants), log_level="warning", access_log=False, lifespan="off"
        )
        server = _Server(config)
        waiter = asyncio.create_task(stop.wait())
        serving = asyncio.create_task(server.serve(sockets=[self.sock]))
        host, port = self.sock.getsockname()[:2]
        log.info("serving the input cache to the CPod's pods on %s:%d", host, port)
        try:
            await asyncio.wait([waiter, serving], return_when=asyncio.FIRST_COMPLETED)
        finally:
            server.should_exit = True
            waiter.cancel()
            await serving
