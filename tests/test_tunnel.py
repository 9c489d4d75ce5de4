"""The agent's tunnel end to end (docs/tunnel.md): a real cloud (served on loopback, its tunnel
service called in its own loop), a real agent process, a real target server, real TCP between."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus
from websockets.frames import Frame, Opcode

from sxwl.agent.tunnel_client import tunnel_url
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.hub import NoTunnel
from sxwl.tunnel.session import STREAM_WINDOW, StreamReset
from tests.support.agent import AgentProcess, eventually, simulated_agent
from tests.support.cloud import test_settings as cloud_settings
from tests.support.threads import run_on_thread
from tests.support.tunnel import InProcessCloud, StallingProxy, Target, provider_key, request

PRODUCT = "SIM-GPU"


class Rig:
    def __init__(self, root: Path, connections: int = 2, proxied: bool = False, **settings: object) -> None:
        self.root = root
        self.target = Target()
        self.cloud = InProcessCloud(
            cloud_settings(root / "cloud", f"sqlite:///{root / 'sxwl.db'}", **settings)
        )
        self.proxy = StallingProxy(self.cloud.served.port) if proxied else None
        self.key = provider_key(self.cloud.url)
        self.agent = self.start_agent(connections)
        self.cpod = json.loads((root / "agent" / "cpod.json").read_text())["cpod_id"]
        self.wait_connections(connections)

    def start_agent(self, connections: int = 2) -> AgentProcess:
        agent = simulated_agent(
            self.proxy.url if self.proxy is not None else self.cloud.url,
            self.root / "agent",
            self.key,
            "--tunnel-allow",
            self.target.address,
            "--tunnel-connections",
            str(connections),
            name="tunnelled",
            gpus=1,
            product=PRODUCT,
        )
        eventually(lambda: (self.root / "agent" / "cpod.json").exists(), what="the agent to register")
        return agent

    def wait_connections(self, count: int) -> None:
        eventually(lambda: self.cloud.connections(self.cpod) == count, what=f"{count} tunnel connections")

    async def fetch(self, path: str, body: bytes | None = None, method: str = "GET") -> tuple[int, bytes]:
        reply = await service.open_stream(
            self.cloud.tunnels, self.cpod, self.target.address, request(method, path, body)
        )
        async with reply:
            return reply.status, bytes(await reply.read())

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.agent.stop()
        self.cloud.stop()
        self.target.stop()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    rig = Rig(tmp_path_factory.mktemp("tunnel"))
    yield rig
    rig.close()


def test_many_concurrent_streams_carry_method_headers_and_bodies(rig: Rig) -> None:
    async def one(index: int) -> tuple[int, bytes, str, str]:
        body = f"stream {index} ".encode() * 1000
        headers = [("X-Probe", f"p{index}"), ("Connection", "keep-alive, x-probe2"), ("X-Probe2", "dropped")]
        reply = await service.open_stream(
            rig.cloud.tunnels, rig.cpod, rig.target.address, request("PUT", "/echo?q=1", body, headers)
        )
        async with reply:
            data = await reply.read()
        seen = dict(reply.headers)
        assert data == body
        return reply.status, data, seen["x-method"], seen["x-seen"]

    async def many() -> list[tuple[int, bytes, str, str]]:
        return await asyncio.gather(*(one(i) for i in range(100)))

    results = rig.cloud.call(many)
    assert [r[0] for r in results] == [200] * 100
    assert {r[2] for r in results} == {"PUT"}
    assert [r[3] for r in results] == [f"p{i}" for i in range(100)]


def test_a_hundred_streams_open_at_once_on_each_connection_and_all_abort_their_requests(rig: Rig) -> None:
    ids = [f"many{i}" for i in range(200)]
    rig.wait_connections(2)  # both up again after an earlier test's cut

    async def run() -> list[int]:
        async def one(name: str) -> service.TunnelResponse:
            reply = await service.open_stream(
                rig.cloud.tunnels, rig.cpod, rig.target.address, request("GET", f"/hold?id={name}")
            )
            assert await reply._stream.read() == b"started\n"
            return reply

        replies = await asyncio.gather(*(one(name) for name in ids))
        open_now = [len(session.streams) for session in rig.cloud.tunnels.held[rig.cpod]]
        for reply in replies:
            reply.close()
        return open_now

    assert rig.cloud.call(run) == [100, 100]  # each new stream goes where there is most room
    eventually(lambda: rig.target.gone >= set(ids), what="every request aborted at the target")


def test_a_slow_reader_stalls_only_its_own_stream(rig: Rig) -> None:
    async def run() -> list[int]:
        # Unread answers of 64 MiB on both connections: each stream buffers at most its window.
        stalled = [
            await service.open_stream(
                rig.cloud.tunnels, rig.cpod, rig.target.address, request("GET", "/bytes?n=67108864")
            )
            for _ in range(4)
        ]
        await asyncio.sleep(1.0)
        # Another stream on the same connections still carries all of its answer (a stalled one
        # would not end before the rig's call gives up).
        status, data = await rig.fetch("/bytes?n=8388608")
        assert status == 200 and len(data) == 8 * 1024 * 1024
        buffered = [sum(len(c) for c, _ in s._stream._chunks) for s in stalled]
        for reply in stalled:
            reply.close()
        return buffered

    buffered = rig.cloud.call(run)
    assert all(0 < size <= STREAM_WINDOW for size in buffered), buffered


def test_a_reset_from_the_cloud_aborts_the_targets_request(rig: Rig) -> None:
    async def run() -> bytes:
        reply = await service.open_stream(
            rig.cloud.tunnels, rig.cpod, rig.target.address, request("GET", "/hold?id=reset")
        )
        first = await reply._stream.read()
        reply.close()  # as a route does when its client disconnects
        return first

    assert rig.cloud.call(run) == b"started\n"
    eventually(lambda: "reset" in rig.target.gone, what="the target to see its client gone")


def test_a_client_that_goes_mid_body_aborts_the_upstream_request(rig: Rig) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"part of a body"
        await asyncio.sleep(0.5)
        raise ConnectionError("the client disconnected")

    async def run() -> None:
        req = service.TunnelRequest("POST", "/hold?id=client", [("content-type", "text/plain")], body())
        reply = await service.open_stream(rig.cloud.tunnels, rig.cpod, rig.target.address, req)
        with pytest.raises(service.TunnelError):
            await reply.read()

    rig.cloud.call(run)
    eventually(lambda: "client" in rig.target.gone, what="the target to see its client gone")


def test_a_target_that_fails_mid_answer_resets_the_stream(rig: Rig) -> None:
    async def run() -> bytes:
        reply = await service.open_stream(
            rig.cloud.tunnels, rig.cpod, rig.target.address, request("GET", "/cut")
        )
        got = b""
        with pytest.raises(service.TunnelError):
            async for chunk in reply.chunks():
                got += chunk
        return got

    assert rig.cloud.call(run) == b"partial"
    assert rig.cloud.call(lambda: rig.fetch("/echo", b"after", "POST")) == (200, b"after")


def test_the_agent_forwards_only_to_targets_it_allows(rig: Rig) -> None:
    async def run(target: str) -> tuple[int, bool, bytes]:
        reply = await service.open_stream(rig.cloud.tunnels, rig.cpod, target, request("GET", "/echo"))
        async with reply:
            return reply.status, reply.from_agent, await reply.read()

    before = rig.target.requests
    for target in ("127.0.0.1:22", "169.254.169.254:80", "localhost:" + str(rig.target.port), "no port"):
        status, from_agent, text = rig.cloud.call(lambda target=target: run(target))  # type: ignore[misc]
        assert (status, from_agent) == (403, True) and b"does not forward" in text
    assert rig.target.requests == before
    with pytest.raises(NoTunnel):
        rig.cloud.call(
            lambda: service.open_stream(
                rig.cloud.tunnels, "nosuchcpod", rig.target.address, request("GET", "/")
            )
        )


def test_keepalive_pings_are_answered_on_every_connection(rig: Rig) -> None:
    async def run() -> int:
        answered = 0
        for session in rig.cloud.tunnels.held[rig.cpod]:
            await session.ping()  # TimeoutError when the agent does not answer
            answered += 1
        return answered

    assert rig.cloud.call(run) == 2


WS_HEADERS = [
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Version", "13"),
]


def test_an_upgrade_passes_raw_bytes_both_ways(rig: Rig) -> None:
    headers = WS_HEADERS

    async def run() -> tuple[int, dict[str, str], bytes]:
        switched = asyncio.Event()

        async def client_bytes() -> AsyncIterator[bytes]:
            await switched.wait()
            yield Frame(Opcode.BINARY, b"hello through the tunnel").serialize(mask=True)
            await asyncio.sleep(3600)  # the client stays until the test closes the stream

        req = service.TunnelRequest("GET", "/ws", headers, client_bytes())
        reply = await service.open_stream(rig.cloud.tunnels, rig.cpod, rig.target.address, req)
        switched.set()
        got = b""
        async for chunk in reply.chunks():
            got += chunk
            if len(got) >= 2 and len(got) >= 2 + got[1]:
                break
        reply.close()
        return reply.status, dict(reply.headers), got

    status, answer, frame = rig.cloud.call(run)
    assert status == 101
    assert answer["upgrade"].lower() == "websocket"
    assert answer["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert frame[0] == 0x82 and frame[2:] == b"echo:hello through the tunnel"


def test_a_wrong_cpod_token_is_refused(rig: Rig) -> None:
    url = tunnel_url(rig.cloud.url)

    async def refused(headers: dict[str, str], at: str = url) -> tuple[int, bytes]:
        with pytest.raises(InvalidStatus) as caught:
            async with websockets.connect(at, additional_headers=headers, open_timeout=5):
                pass
        return caught.value.response.status_code, bytes(caught.value.response.body or b"")

    status, body = run_on_thread(refused({"Authorization": "Bearer not-a-token"}))
    assert status == 401 and b"cpod_revoked" in body
    assert run_on_thread(refused({}))[0] == 401
    account = {"email": "someone@example.com", "password": "correct horse", "role": "user"}
    httpx.post(f"{rig.cloud.url}/api/v1/auth/register", json=account).raise_for_status()
    credentials = {"email": account["email"], "password": account["password"]}
    login = httpx.post(f"{rig.cloud.url}/api/v1/auth/login", json=credentials).json()["access_token"]
    status, body = run_on_thread(refused({"Authorization": f"Bearer {login}"}))
    assert status == 403 and b"not_a_cpod" in body  # a user's token is no CPod's
    # The CPod's real token counts only in the header: in the URL it is no credential.
    token = json.loads((rig.root / "agent" / "cpod.json").read_text())["cpod_token"]
    assert run_on_thread(refused({}, f"{url}?token={token}&access_token={token}"))[0] == 401
    assert rig.cloud.connections(rig.cpod) == 2


def test_two_connections_and_one_cut_leaves_the_other_working(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        first, second = rig.cloud.tunnels.held[rig.cpod]

        async def cut_and_fetch() -> tuple[int, bytes]:
            held = await service.open_stream(
                rig.cloud.tunnels, rig.cpod, rig.target.address, request("GET", "/hold?id=cut")
            )
            on = held._stream.session
            await on.close()
            with pytest.raises(service.TunnelError):
                await held.read()  # its stream fails with its connection
            return await rig.fetch("/echo", b"still here", "POST")

        assert rig.cloud.call(cut_and_fetch) == (200, b"still here")
        eventually(lambda: "cut" in rig.target.gone, what="the cut stream's request aborted")
        rig.wait_connections(2)  # the agent dialled the lost one again
        assert {id(s) for s in rig.cloud.tunnels.held[rig.cpod]} - {id(first), id(second)}
    finally:
        rig.close()


def test_a_silent_agent_is_found_by_its_pings_and_dials_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path, tunnel_ping_s=0.5)
    try:
        rig.agent.signal(signal.SIGSTOP)  # its connections stay open, and nothing answers on them
        eventually(
            lambda: rig.cloud.connections(rig.cpod) == 0, timeout=10, what="unanswered PINGs to close them"
        )
        rig.agent.signal(signal.SIGCONT)
        rig.wait_connections(2)
        assert rig.cloud.call(lambda: rig.fetch("/echo", b"awake", "POST")) == (200, b"awake")
    finally:
        rig.agent.signal(signal.SIGCONT)
        rig.close()


def test_the_agent_dials_again_after_the_cloud_restarts(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        assert rig.cloud.call(lambda: rig.fetch("/echo", b"before", "POST")) == (200, b"before")
        port = rig.cloud.served.port
        rig.cloud.stop()
        rig.cloud = InProcessCloud(rig.cloud.settings, port=port)
        rig.wait_connections(2)
        assert rig.cloud.call(lambda: rig.fetch("/echo", b"after", "POST")) == (200, b"after")
        assert rig.agent.proc.poll() is None
    finally:
        rig.close()


def test_idle_agent_without_a_tunnel_flag_dials_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, connections=0)
    try:
        time.sleep(1.0)
        assert rig.cloud.connections(rig.cpod) == 0
        # A loaded 2-core machine kept the in-process cloud from answering within httpx's 5 s.
        assert httpx.get(f"{rig.cloud.url}/healthz", timeout=60).status_code == 200
        assert "tunnel" not in rig.agent.log
    finally:
        rig.close()


async def _ws(rig: Rig) -> tuple[service.TunnelResponse, asyncio.Queue[bytes]]:
    """A WebSocket to the target's echo through the tunnel, and where its client's frames go."""
    outgoing: asyncio.Queue[bytes] = asyncio.Queue()

    async def client_bytes() -> AsyncIterator[bytes]:
        while True:
            yield await outgoing.get()

    req = service.TunnelRequest("GET", "/ws", WS_HEADERS, client_bytes())
    reply = await service.open_stream(rig.cloud.tunnels, rig.cpod, rig.target.address, req)
    assert reply.status == 101
    return reply, outgoing


async def _echo(reply: service.TunnelResponse, outgoing: asyncio.Queue[bytes], text: bytes) -> bytes:
    outgoing.put_nowait(Frame(Opcode.BINARY, text).serialize(mask=True))
    got = b""
    while len(got) < 2 or len(got) < 2 + got[1]:
        got += await reply._stream.read()
    return got[2:]


def test_a_stalled_connection_holds_only_its_own_streams(tmp_path: Path) -> None:
    rig = Rig(tmp_path, proxied=True, tunnel_ping_s=1.0)
    try:

        async def run() -> tuple[bytes | BaseException, bytes | BaseException]:
            a, b = await _ws(rig), await _ws(rig)
            assert a[0]._stream.session is not b[0]._stream.session  # one on each connection
            assert (await _echo(*a, b"a"), await _echo(*b, b"b")) == (b"echo:a", b"echo:b")
            assert rig.proxy is not None
            rig.proxy.stalled.add(rig.proxy.tunnels[0])  # one connection goes quiet, nothing closes
            during = await asyncio.gather(
                asyncio.wait_for(_echo(*a, b"a2"), 5),
                asyncio.wait_for(_echo(*b, b"b2"), 5),
                return_exceptions=True,
            )
            healthy = a if during[0] == b"echo:a2" else b
            assert await _echo(*healthy, b"after") == b"echo:after"
            return during

        during = rig.cloud.call(run)
        # The stream on the quiet connection got nothing, and failed when PINGs closed its connection.
        assert len([r for r in during if isinstance(r, StreamReset)]) == 1, during
        assert len(set(during) & {b"echo:a2", b"echo:b2"}) == 1, during
        rig.wait_connections(2)  # the agent dialled the closed one again
        assert rig.cloud.call(lambda: rig.fetch("/echo", b"fine", "POST")) == (200, b"fine")
    finally:
        rig.close()
