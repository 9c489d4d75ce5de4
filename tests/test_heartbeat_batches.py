"""Heartbeats written in batches (group commit): the batching itself, and that a batch decides each
heartbeat exactly as if it had come alone (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text, update

from sxwl.cloud.db.models import CPod, CPodEvent
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.groupcommit import GroupCommit
from sxwl.cloud.services.fleet import heartbeats
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.protocol import Heartbeat, HeartbeatReply
from tests.conftest import login
from tests.support.cpods import beat, gpu_node, register_cpod
from tests.test_cpods_api import ctx_of, provider

# ---- the group commit ------------------------------------------------------------------------------


def run_in_own_loop(coroutine: Coroutine[Any, Any, None]) -> None:
    """On a thread of its own: the browser tests' Playwright keeps an event loop running on this one."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()


class Recorder:
    """A write function that records its batches, can be held, and fails items on request."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def __call__(self, items: Sequence[int]) -> list[int | Exception]:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.entered.set()
        try:
            self.release.wait(5)
            if -1 in items:
                raise RuntimeError("the whole transaction failed")
            self.batches.append(list(items))
            return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]
        finally:
            with self._lock:
                self.inside -= 1


def test_a_lone_item_is_written_at_once_and_concurrent_ones_together() -> None:
    run_in_own_loop(_a_lone_item_is_written_at_once_and_concurrent_ones_together())


async def _a_lone_item_is_written_at_once_and_concurrent_ones_together() -> None:
    write = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(write)
    assert await commit.submit(1) == 10
    assert await asyncio.gather(*(commit.submit(i) for i in range(2, 12))) == [i * 10 for i in range(2, 12)]
    assert write.batches == [[1], list(range(2, 12))]


def test_items_arriving_during_a_write_go_in_the_next_batch() -> None:
    run_in_own_loop(_items_arriving_during_a_write_go_in_the_next_batch())


async def _items_arriving_during_a_write_go_in_the_next_batch() -> None:
    write = Recorder()
    write.release.clear()
    commit: GroupCommit[int, int] = GroupCommit(write)
    first = asyncio.create_task(commit.submit(1))
    assert await asyncio.to_thread(write.entered.wait, 5)  # the first batch is being written, and held
    rest = [asyncio.create_task(commit.submit(i)) for i in range(2, 7)]
    await asyncio.sleep(0.05)
    write.release.set()
    assert await first == 10 and [await r for r in rest] == [20, 30, 40, 50, 60]
    assert write.batches == [[1], [2, 3, 4, 5, 6]]
    # The writer ended with the queue; the next item starts a new one.
    assert await commit.submit(7) == 70


def test_errors_reach_only_their_callers_and_a_failed_write_is_retried_alone() -> None:
    run_in_own_loop(_errors_reach_only_their_callers_and_a_failed_write_is_retried_alone())


async def _errors_reach_only_their_callers_and_a_failed_write_is_retried_alone() -> None:
    commit: GroupCommit[int, int] = GroupCommit(Recorder())
    results = await asyncio.gather(*(commit.submit(i) for i in (1, -5, 3)), return_exceptions=True)
    assert results[0] == 10 and results[2] == 30
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad -5"
    failed = await asyncio.gather(*(commit.submit(i) for i in (4, -1)), return_exceptions=True)
    # The batch [4, -1] failed whole; written again one by one, only -1 fails.
    assert failed[0] == 40 and isinstance(failed[1], RuntimeError)
    assert await commit.submit(8) == 80  # and the writer carries on


def test_one_write_at_a_time_in_batches_of_at_most_max_batch() -> None:
    run_in_own_loop(_one_write_at_a_time_in_batches_of_at_most_max_batch())


async def _one_write_at_a_time_in_batches_of_at_most_max_batch() -> None:
    write = Recorder()
    write.release.clear()
    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=2)
    tasks = [asyncio.create_task(commit.submit(i)) for i in range(1, 8)]
    await asyncio.sleep(0.1)
    write.release.set()
    assert [await t for t in tasks] == [i * 10 for i in range(1, 8)]
    assert write.most_inside == 1
    assert write.batches == [[1, 2], [3, 4], [5, 6], [7]]


# ---- a batch of heartbeats against the database -------------------------------------------------------


def hb(seq: int, *names: str, **extra: Any) -> Heartbeat:
    return Heartbeat.model_validate({"seq": seq, "nodes": [gpu_node(n) for n in names], **extra})


def online_events(client: TestClient, cpod_id: str) -> int:
    with ctx_of(client).db.session() as session:
        return len(
            session.scalars(
                select(CPodEvent).where(CPodEvent.cpod_id == cpod_id, CPodEvent.kind == "online")
            ).all()
        )


def test_one_batch_decides_each_beat_as_if_it_came_alone(client: TestClient) -> None:
    headers, key = provider(client)
    a, b = register_cpod(client, key, "cluster-a"), register_cpod(client, key, "cluster-b")
    revoked = register_cpod(client, key, "cluster-c")
    assert client.delete(f"/api/v1/cpods/{revoked['cpod_id']}", headers=headers).status_code == 204
    user_token = login(client, "owner@example.com")["Authorization"].removeprefix("Bearer ")
    beats = [
        Beat.of(a["cpod_token"], hb(1, "a1")),
        Beat.of(a["cpod_token"], hb(2, "a1", "a2")),
        Beat.of(a["cpod_token"], hb(2, "stale")),
        Beat.of(b["cpod_token"], hb(7, "b1", cpod_id=a["cpod_id"])),
        Beat.of(b["cpod_token"], hb(3, "b1")),
        Beat.of(revoked["cpod_token"], hb(1, "c1")),
        Beat.of(user_token, hb(1, "u1")),
    ]
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        outcomes = heartbeats.apply(session, beats)
    replies = [(o.accepted, o.last_seq, o.status) if isinstance(o, HeartbeatReply) else o for o in outcomes]
    assert replies[:3] == [(True, 1, "online"), (True, 2, "online"), (False, 2, "online")]
    assert isinstance(replies[3], AppError) and replies[3].code == "wrong_cpod"
    assert replies[4] == (True, 3, "online")
    assert isinstance(replies[5], AppError) and (replies[5].status, replies[5].code) == (401, "cpod_revoked")
    assert isinstance(replies[6], AppError) and (replies[6].status, replies[6].code) == (403, "not_a_cpod")

    by_id = {c["id"]: c for c in client.get("/api/v1/cpods", headers=headers).json()}
    assert [n["name"] for n in by_id[a["cpod_id"]]["nodes"]] == ["a1", "a2"]
    assert [n["name"] for n in by_id[b["cpod_id"]]["nodes"]] == ["b1"]
    assert by_id[revoked["cpod_id"]]["nodes"] == []
    # Online once, however many of its beats the batch held.
    assert online_events(client, a["cpod_id"]) == 1 and online_events(client, b["cpod_id"]) == 1


def test_a_newer_beat_written_meanwhile_wins_over_the_batch(client: TestClient) -> None:
    """Another replica applies seq 9 after this batch read the rows: the batch's seq 2 is not
    accepted, is not written, and records no online event."""
    headers, key = provider(client)
    reg = register_cpod(client, key)
    ctx = ctx_of(client)

    fired: list[bool] = []

    def other_replica(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not fired and statement.startswith("UPDATE cpods SET") and "nodes=" in statement:
            fired.append(True)
            conn.execute(update(CPod).where(CPod.id == reg["cpod_id"]).values(last_seq=9))

    event.listen(ctx.db.engine, "before_cursor_execute", other_replica)
    try:
        with ctx.db.session() as session:
            beats = [Beat.of(reg["cpod_token"], hb(2, "n1"))]
            (outcome,) = heartbeats.apply(session, beats)
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", other_replica)
    assert fired
    assert isinstance(outcome, HeartbeatReply)
    assert (outcome.accepted, outcome.last_seq) == (False, 9)
    (cpod,) = client.get("/api/v1/cpods", headers=headers).json()
    assert cpod["nodes"] == [] and cpod["status"] != "online"
    assert online_events(client, reg["cpod_id"]) == 0


def test_many_agents_at_once_through_the_api(client: TestClient) -> None:
    """Twelve agents beating concurrently (their beats share batches): every beat is answered as if
    alone, and each CPod ends with its last inventory."""
    headers, key = provider(client)
    agents = [register_cpod(client, key, f"cluster-{i:04d}") for i in range(12)]

    def run(agent: dict[str, Any]) -> list[tuple[bool, int]]:
        answers = []
        for seq in range(1, 6):
            reply = beat(client, agent["cpod_token"], seq, [gpu_node(f"node-{seq}")]).json()
            answers.append((reply["accepted"], reply["last_seq"]))
        return answers

    with ThreadPoolExecutor(len(agents)) as pool:
        answers = list(pool.map(run, agents))
    assert answers == [[(True, seq) for seq in range(1, 6)]] * len(agents)
    rows = client.get("/api/v1/cpods", headers=headers).json()
    assert {c["status"] for c in rows} == {"online"}
    assert {c["nodes"][0]["name"] for c in rows} == {"node-5"}
    with ctx_of(client).db.session() as session:
        assert set(session.scalars(select(CPod.last_seq))) == {5}


def test_postgresql_compresses_node_snapshots_with_lz4(client: TestClient) -> None:
    ctx = ctx_of(client)
    if ctx.db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite does not compress")
    with ctx.db.session() as session:
        method = session.execute(
            text(
                "SELECT attcompression FROM pg_attribute "
                "WHERE attrelid = 'cpods'::regclass AND attname = 'nodes'"
            )
        ).scalar_one()
    assert method == "l"  # lz4; PostgreSQL's default pglz cost more CPU than the rest of a heartbeat
