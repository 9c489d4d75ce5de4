"""The replica's one task that writes the keep-alive newlines of streamed long-polls
(cloud/edge/keepalives.py): on its own, with recording sends, and under uvicorn, where a CPod that goes
away in the middle of a hold releases its waiter and gets no more newlines."""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.types import Message

from sxwl.cloud.app import create_app
from sxwl.cloud.context import CloudContext
from sxwl.cloud.edge.keepalives import KEEPALIVE, Keepalives
from tests.conftest import MakeSettings
from tests.support.agent import eventually
from tests.support.replicas import RawCPod
from tests.support.served import Served
from tests.support.threads import run_on_thread

INTERVAL_S = 0.1


class Recorder:
    """An ASGI send that keeps the loop time of every message it is given."""

    def __init__(self, fails: bool = False) -> None:
        self.times: list[float] = []
        self.fails = fails
        self.written = asyncio.Event()

    async def __call__(self, message: Message) -> None:
        assert message == {"type": "http.response.body", "body": KEEPALIVE, "more_body": True}
        self.times.append(asyncio.get_running_loop().time())
        self.written.set()
        if self.fails:
            raise RuntimeError("the response has ended")


def test_each_stream_gets_a_newline_each_interval_until_closed() -> None:
    async def scenario() -> tuple[list[Recorder], float, float]:
        keepalives = Keepalives(INTERVAL_S)
        loop = asyncio.get_running_loop()
        recorders = [Recorder() for _ in range(50)]
        broken = Recorder(fails=True)
        streams = [keepalives.add(r) for r in recorders]
        keepalives.add(broken)
        started = loop.time()
        await asyncio.sleep(INTERVAL_S * 5.5)
        closed_at = loop.time()
        for stream in streams[:25]:
            keepalives.close(stream)
        await asyncio.sleep(INTERVAL_S * 3)
        assert len(broken.times) == 1  # a send that fails drops its stream
        return recorders, started, closed_at

    recorders, started, closed_at = run_on_thread(scenario())
    tick = INTERVAL_S / 5
    for index, recorder in enumerate(recorders):
        assert recorder.times, f"stream {index} got no newline"
        # Never more often than the interval allows (a busy machine can only make them later).
        gaps = [b - a for a, b in zip([started, *recorder.times], recorder.times, strict=False)]
        assert all(g >= INTERVAL_S - tick - 0.01 for g in gaps), gaps
        if index < 25:
            assert all(t <= closed_at for t in recorder.times)  # nothing after its close
        else:
            assert recorder.times[-1] > closed_at


def test_a_cpod_that_goes_away_mid_hold_releases_its_waiter(make_settings: MakeSettings) -> None:
    settings = make_settings(longpoll_keepalive_s=0.2)
    app = create_app(settings)
    ctx: CloudContext = app.state.ctx
    with Served(app, settings) as served:
        api = f"{served.url}/api/v1"
        body = {"email": "owner@example.com", "password": "correct horse", "role": "provider"}
        httpx.post(f"{api}/auth/register", json=body).raise_for_status()
        login = httpx.post(f"{api}/auth/login", json={"email": body["email"], "password": body["password"]})
        provider = {"Authorization": f"Bearer {login.json()['access_token']}"}
        key = httpx.get(f"{api}/me/access-key", headers=provider).json()["access_key"]
        cpod = RawCPod(served.url, key, "keepalive-01")
        sock = served.connect()
        head = (
            f"GET /api/v1/agent/assignments?wait=30 HTTP/1.1\r\nHost: t\r\n"
            f"Authorization: {cpod.headers['Authorization']}\r\n\r\n"
        )
        sock.sendall(head.encode())
        received = b""
        deadline = time.monotonic() + 10
        while received.count(b"\n1\r\n\n\r\n") < 3:  # three chunked newlines: the hold streams
            assert time.monotonic() < deadline, received
            received += sock.recv(4096)
        assert ctx.notifier.held_polls(cpod.id) == 1
        sock.close()
        eventually(lambda: ctx.notifier.held_polls(cpod.id) == 0, timeout=10, what="the waiter's release")


def test_stop_ends_the_task_and_a_later_stream_starts_it_again() -> None:
    async def scenario() -> None:
        keepalives = Keepalives(INTERVAL_S)
        first = Recorder()
        keepalives.add(first)
        await asyncio.wait_for(first.written.wait(), 10)
        await keepalives.stop()
        written = len(first.times)
        await asyncio.sleep(INTERVAL_S * 3)
        assert len(first.times) == written  # stopped: nothing more is written
        second = Recorder()
        keepalives.add(second)
        await asyncio.wait_for(second.written.wait(), 10)  # the task runs again
        await keepalives.stop()

    run_on_thread(scenario())
