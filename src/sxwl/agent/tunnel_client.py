"""The agent's tunnel: a few WebSockets dialled to the cloud's public URL (the same base URL and TLS
as the long-polls, the CPod token in the Authorization header), each carrying one HTTP/2 connection
on which the cloud opens streams and the agent answers them (docs/tunnel.md).

Several connections, so that one TCP connection stalled somewhere between does not hold every
stream; each is re-dialled with jittered backoff when it ends, through the load balancer, so an
agent whose replica stopped lands on another."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import certifi
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus, WebSocketException

import sxwl
from sxwl.agent.engine_load import InFlight
from sxwl.agent.forward_targets import Targets
from sxwl.agent.tunnel_forward import forward
from sxwl.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION, paths
from sxwl.tunnel.headers import TARGET, first, split_target
from sxwl.tunnel.session import MESSAGE_MAX, PING_S, Session, TunnelStream
from sxwl.tunnel.websocket import ClientTransport

log = logging.getLogger("sxwl.agent.tunnel")

OPEN_TIMEOUT_S = 15.0
# A connection that lasted this long was a working one: its end starts the backoff afresh.
HEALTHY_S = 30.0
# After a refused token the cloud will not change its mind soon; heartbeats stop the agent if revoked.
REFUSED_FAILURES = 6


@dataclass(frozen=True)
class TunnelSettings:
    connections: int = 2
    targets: frozenset[str] = frozenset()  # host:port the agent forwards streams to
    ping_s: float = PING_S

    @classmethod
    def from_flags(cls, connections: int, allow: list[str]) -> TunnelSettings:
        for target in allow:
            if split_target(target) is None:
                raise ValueError(f"--tunnel-allow {target!r}: give HOST:PORT")
        return cls(connections=connections, targets=frozenset(t.lower() for t in allow))


NO_TUNNEL = TunnelSettings(connections=0)
TUNNEL_HELP = {
    "connections": "WebSockets kept open to the cloud for its tunnel (docs/tunnel.md); 0: no tunnel.",
    "allow": "An address on this CPod the cloud may reach through the tunnel; repeat for several.",
}


def tunnel_url(api_url: str) -> str:
    """The tunnel's WebSocket URL on the cloud's own base URL: wss:// where the API is https://."""
    base = api_url.rstrip("/")
    scheme, rest = base.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{paths.url(paths.TUNNEL)}"


def tls_context() -> ssl.SSLContext:
    """The roots the agent's HTTP client trusts (httpx's: SSL_CERT_FILE or SSL_CERT_DIR, else certifi),
    so the tunnel reaches every cloud the long-polls reach."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    return ssl.create_default_context(cafile=certifi.where())


class TunnelClient:
    def __init__(
        self,
        api_url: str,
        token: str,
        settings: TunnelSettings,
        backoff: Callable[[int], float],
        targets: Targets | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        """``targets``: the attempts' own services (engines, dev environments), found by the runtime;
        ``in_flight``: where the streams to each of them are counted (an engine's load, engine_load.py)."""
        self.url, self.token, self.settings, self.backoff = tunnel_url(api_url), token, settings, backoff
        self.targets = targets
        self.in_flight = in_flight or InFlight()
        self.sessions: set[Session] = set()
        normalised = {t.lower() for t in settings.targets if split_target(t) is not None}
        self._targets = frozenset(normalised)

    def allowed(self, target: str) -> bool:
        return target.lower() in self._targets

    async def run(self) -> None:
        """Keeps ``connections`` connections up until cancelled."""
        dialers = [
            asyncio.create_task(self._dial(index), name=f"tunnel-{index}")
            for index in range(self.settings.connections)
        ]
        try:
            await asyncio.gather(*dialers)
        finally:
            for task in dialers:
                task.cancel()
            await asyncio.gather(*dialers, return_exceptions=True)

    async def _dial(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        headers = {
            "Authorization": f"Bearer {self.token}",
            PROTOCOL_HEADER: str(PROTOCOL_VERSION),
            "User-Agent": f"sxwl-agent/{sxwl.__version__}",
        }
        while True:
            started = loop.time()
            try:
                async with websockets.connect(
                    self.url,
                    additional_headers=headers,
                    ssl=tls_context() if self.url.startswith("wss://") else None,
                    open_timeout=OPEN_TIMEOUT_S,
                    ping_interval=None,  # HTTP/2 PINGs keep it alive and find a dead peer
                    max_size=2 * MESSAGE_MAX,
                    compression=None,
                    user_agent_header=None,
                ) as ws:
                    log.info("tunnel connection %d up", index)
                    await self._serve(ws)
                    log.info("tunnel connection %d ended", index)
            except InvalidStatus as exc:
                status = exc.response.status_code
                log.warning("the cloud refused tunnel connection %d: HTTP %d", index, status)
                if status in (401, 403):
                    failures = max(failures, REFUSED_FAILURES)
            except (OSError, TimeoutError, WebSocketException) as exc:
                log.warning("tunnel connection %d failed: %s", index, exc or type(exc).__name__)
            if loop.time() - started >= HEALTHY_S:
                failures = 0
            delay = self.backoff(failures)
            failures += 1
            await asyncio.sleep(delay)

    async def _serve(self, ws: ClientConnection) -> None:
        session = Session(
            ClientTransport(ws), client_side=False, on_stream=self._on_stream, ping_s=self.settings.ping_s
        )
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)

    async def _on_stream(self, stream: TunnelStream) -> None:
        own = self.targets(first(await stream.head(), TARGET) or "") if self.targets else None
        with self.in_flight.counting(own):
            await forward(stream, self.allowed, self.targets)
