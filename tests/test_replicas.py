"""Replicas as separate `sxwl serve` processes on one PostgreSQL wake each other with LISTEN/NOTIFY
(docs/replicas.md). The replicas re-read on their own only every 60 s (BACKSTOP_S), so anything a
test sees sooner was carried by a notification."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sxwl.cloud.background import listener
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.kit.notify import on_commit
from tests.support.agent import eventually
from tests.support.cloud import test_settings as settings_for  # not collected as a test
from tests.support.postgres import TempPostgres
from tests.support.replicas import BACKSTOP_S, Balancer, Fleet, RawCPod, logging_postgres

# Well before the backstop: what arrives within this was woken by a notification.
PROMPTLY_S = BACKSTOP_S / 4


@pytest.fixture(scope="module")
def pg() -> Iterator[TempPostgres]:
    cluster = logging_postgres()
    yield cluster
    cluster.stop()


@pytest.fixture
def fleet2(tmp_path: Path, pg: TempPostgres) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path, pg, 2)
    yield fleet
    fleet.close()


class Poll(threading.Thread):
    """One long-poll held in the background."""

    def __init__(self, cpod: RawCPod, url: str, wait: float) -> None:
        super().__init__(daemon=True)
        self.cpod, self.url, self.wait = cpod, url, wait
        self.reply: dict[str, Any] | None = None
        self.start()

    def run(self) -> None:
        self.reply = self.cpod.long_poll(self.url, self.wait)

    def result(self, timeout: float) -> dict[str, Any]:
        self.join(timeout)
        assert self.reply is not None, f"the long-poll did not answer within {timeout}s"
        return self.reply


def reads_dispatch(fleet: Fleet, replica: str, since: int) -> bool:
    """Whether ``replica`` has read a CPod's pending commands (a long-poll's read) since ``since``."""
    return any("agent_commands" in s for s in fleet.statements(replica, since))


def test_a_job_submitted_on_one_replica_reaches_an_agent_polling_another(fleet2: Fleet) -> None:
    fleet2.agent(fleet2.replicas[1].url)
    eventually(fleet2.online, what="the CPod online")
    submitted = time.monotonic()
    job_id = fleet2.submit(0, "sleep 1; echo first; sleep 1; echo second")
    # Followed on the replica it was submitted on, while the agent appends its output on the other.
    output, offset, complete = "", 0, False
    while not complete:
        piece = httpx.get(
            fleet2.api(0, f"/jobs/{job_id}/logs"),
            headers=fleet2.user,
            params={"offset": offset, "wait": 30},
            timeout=40,
        )
        output += piece.text
        offset, complete = int(piece.headers["X-Next-Offset"]), piece.headers["X-Log-Complete"] == "true"
        assert time.monotonic() - submitted < PROMPTLY_S, output
    assert output == "first\nsecond\n"
    job = fleet2.wait_state(1, job_id, "succeeded", timeout=PROMPTLY_S)
    assert job["attempt"] == 1


def test_a_cancel_on_one_replica_reaches_the_agent_on_another(tmp_path: Path, pg: TempPostgres) -> None:
    fleet = Fleet(tmp_path, pg, 3)
    try:
        fleet.agent(fleet.replicas[1].url)
        eventually(fleet.online, what="the CPod online")
        job_id = fleet.submit(0, "echo started; sleep 300")
        fleet.wait_state(2, job_id, "running", timeout=PROMPTLY_S)
        cancelled = time.monotonic()
        reply = httpx.post(fleet.api(2, f"/jobs/{job_id}/cancel"), headers=fleet.user)
        assert reply.json()["cancel_requested"] is True
        fleet.wait_state(0, job_id, "cancelled", timeout=PROMPTLY_S)
        assert time.monotonic() - cancelled < PROMPTLY_S
    finally:
        fleet.close()


def test_an_idle_long_poll_makes_no_query_after_its_first_read(fleet2: Fleet) -> None:
    cpod = RawCPod(fleet2.replicas[0].url, fleet2.key, "cluster-idle-01")
    cpod.beat()
    start = fleet2.log_size()
    poll = Poll(cpod, fleet2.replicas[1].url, wait=30)
    eventually(lambda: reads_dispatch(fleet2, "r2", start), what="the long-poll's first read")
    time.sleep(0.3)  # its answer to the read returned; it now waits
    idle_from = fleet2.log_size()
    time.sleep(3)
    assert fleet2.statements("r2", idle_from) == []
    assert poll.is_alive()
    # Still waiting, and woken by the other replica's assignment.
    job_id = fleet2.submit(0, "true")
    reply = poll.result(PROMPTLY_S)
    assert [a["job_id"] for a in reply["assignments"]] == [job_id]


def test_a_dropped_listening_connection_reconnects_and_rereads(fleet2: Fleet) -> None:
    cpod = RawCPod(fleet2.replicas[0].url, fleet2.key, "cluster-drop-01")
    cpod.beat()
    start = fleet2.log_size()
    poll = Poll(cpod, fleet2.replicas[1].url, wait=40)
    eventually(lambda: reads_dispatch(fleet2, "r2", start), what="the long-poll's first read")
    time.sleep(0.3)
    dropped_at = fleet2.log_size()
    with psycopg.connect(fleet2.postgres.url(), autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'r2' AND query LIKE 'LISTEN%'"
        ).fetchall()
    assert killed == [(True,)]

    def listening_again() -> bool:
        listened = any("LISTEN sxwl_wakeups" in s for s in fleet2.statements("r2", dropped_at))
        return listened and reads_dispatch(fleet2, "r2", dropped_at)

    # What was committed while nobody listened is found by the re-read that follows the reconnect.
    eventually(listening_again, timeout=PROMPTLY_S, what="a new LISTEN and a re-read")
    assert poll.is_alive()
    job_id = fleet2.submit(0, "true")
    assert [a["job_id"] for a in poll.result(PROMPTLY_S)["assignments"]] == [job_id]


def test_a_killed_replica_loses_nothing_and_assigns_nothing_twice(fleet2: Fleet) -> None:
    balancer = Balancer(fleet2.replicas[1].port)
    try:
        agent = fleet2.agent(balancer.url)
        eventually(fleet2.online, what="the CPod online")
        running = fleet2.submit(0, "sleep 3; echo survived")
        fleet2.wait_state(0, running, "running", timeout=PROMPTLY_S)
        fleet2.replicas[1].kill()  # with the agent's long-poll and heartbeats in flight
        balancer.target = fleet2.replicas[0].port
        later = fleet2.submit(0, "echo after the kill")
        for job_id in (running, later):
            job = fleet2.wait_state(0, job_id, "succeeded", "failed", timeout=PROMPTLY_S)
            assert job["state"] == "succeeded" and job["attempt"] == 1, job
            events = fleet2.events(0, job_id)
            assert "lost" not in events and "requeued" not in events, events
        assert agent.proc.poll() is None
    finally:
        balancer.close()


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(int(PROMPTLY_S * 100)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_notifications_are_counted_and_a_replica_skips_its_own(tmp_path: Path, pg: TempPostgres) -> None:
    url = pg.create_database()
    a, b = (CloudContext.from_settings(settings_for(tmp_path / name, url)) for name in ("a", "b"))
    migrate.upgrade(a.db.engine)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        listeners = []
        for ctx in (a, b):
            ctx.notifier.bind(loop)
            listeners.append(asyncio.create_task(listener.run(ctx)))
        await until(lambda: a.notifier.hearing and b.notifier.hearing, "both listening")
        on_a, on_b = a.notifier.waiter("cpod-1"), b.notifier.waiter("cpod-1")
        with a.db.session() as session:
            on_commit(session).wake_cpod("cpod-1")
            on_commit(session).wake_job("job-1")
        await asyncio.wait_for(asyncio.gather(on_a.wait(), on_b.wait()), timeout=PROMPTLY_S)
        await until(lambda: b.notifier.notifications_received == 2, "b received both")
        await asyncio.sleep(0.2)  # a's own notifications reach its listener too, and are skipped
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)

    try:
        # On a thread of its own: once the session's browser tests ran, Playwright keeps an event loop
        # running on the main thread, where asyncio.run refuses to start another.
        with ThreadPoolExecutor(1) as apart:
            apart.submit(asyncio.run, scenario()).result()
    finally:
        a.db.dispose()
        b.db.dispose()
    assert (a.notifier.notifications_sent, a.notifier.notifications_received) == (2, 0)
    assert (b.notifier.notifications_sent, b.notifier.notifications_received) == (0, 2)


def test_a_listener_gone_deaf_is_found_by_its_probe_and_listens_again(
    tmp_path: Path, pg: TempPostgres, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listener, "PROBE_S", 0.3)
    monkeypatch.setattr(listener, "PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(listener, "CONNECT_TIMEOUT_S", 2)
    network = Balancer(pg.port)
    url = pg.create_database().replace(f":{pg.port}/", f":{network.port}/")
    ctx = CloudContext.from_settings(settings_for(tmp_path / "r", url))
    migrate.upgrade(ctx.db.engine)

    async def scenario() -> None:
        ctx.notifier.bind(asyncio.get_running_loop())
        task = asyncio.create_task(listener.run(ctx))
        await until(lambda: ctx.notifier.hearing, "listening")
        await asyncio.sleep(1.5)  # quiet, but its probes come back: nothing counts as lost
        assert ctx.notifier.hearing
        assert not [r for r in caplog.records if getattr(r, "event", None) == "listener_lost"]
        woken = ctx.notifier.waiter("cpod-1")
        network.stalled = True  # no FIN, no error: only the probe can tell
        await until(lambda: not ctx.notifier.hearing, "the deaf listener found")
        assert woken.is_set()  # whatever waits re-reads, and goes on re-reading every second
        assert ctx.notifier.reread_s(3600) == 1.0
        network.stalled = False
        await until(lambda: ctx.notifier.hearing, "listening again")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    try:
        with ThreadPoolExecutor(1) as apart:
            apart.submit(asyncio.run, scenario()).result()
    finally:
        ctx.db.dispose()
        network.close()
    lost = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listener_lost"]
    assert lost and lost[0].endswith("its own probe did not come back within 0.5 s"), lost
