"""Data near the GPUs (docs/finetune-locality.md): among the CPods that fit, a job with inputs goes
to the one holding most of their bytes; fitting and the fair order always come first; inputs and
fine-tunes go only to local CPods; and the heartbeat's cache is what the scheduler reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, insert, select, update

from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.json_rows import CachedRow
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet import heartbeats
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.cloud.services.scheduling import scheduler
from sxwl.cloud.services.scheduling.placement import (
    CPodCapacity,
    Need,
    NodeCapacity,
    Placement,
    Pool,
    why_not,
)
from sxwl.protocol import Heartbeat, HeartbeatReply
from sxwl.protocol.reasons import english
from tests.conftest import MakeSettings
from tests.support.cpods import A100, beat, gpu_node, register_cpod
from tests.test_cpods_api import ctx_of, provider

PRODUCT = str(A100["product"])
H100 = "NVIDIA-H100-80GB-HBM3"
MODEL, DATA, OTHER = "a" * 64, "b" * 64, "c" * 64
GiB = 1 << 30
INPUTS = ((MODEL, 16 * GiB), (DATA, 1 * GiB))  # a base model and a training file


def pod(cpod_id: str, *free: int, cached: tuple[str, ...] = (), runtime: str = "local") -> CPodCapacity:
    """A CPod of 8-GPU A100 nodes with these free GPUs each."""
    nodes = [NodeCapacity(f"{cpod_id}-n{i}", PRODUCT, 8, f) for i, f in enumerate(free)]
    return CPodCapacity(
        cpod_id, nodes, runtime=runtime, takes_fine_tunes=runtime == "local", cached=frozenset(cached)
    )


def fine_tune(gpus: int = 2, nodes: int = 1, **extra: Any) -> Need:
    return Need(PRODUCT, gpus, nodes, inputs=INPUTS, trainer=True, **extra)


# ---- placement, without a database -------------------------------------------------------------------


def test_the_holder_wins_over_a_tighter_fit() -> None:
    pool = Pool([pod("c1", 2), pod("c2", 8, cached=(MODEL,))])
    assert pool.place(Need(PRODUCT, 2, 1)) == Placement("c1", ["c1-n0"])  # best fit, no inputs
    assert pool.place(fine_tune()) == Placement("c2", ["c2-n0"])


def test_a_holder_without_room_is_not_chosen() -> None:
    pool = Pool([pod("c1", 1, cached=(MODEL, DATA)), pod("c2", 4), pod("c3", 3)])
    assert pool.place(fine_tune(2)) == Placement("c3", ["c3-n0"])  # best fit among those that fit
    assert pool.place(fine_tune(4)) == Placement("c2", ["c2-n0"])
    assert pool.place(fine_tune(5)) is None


def test_locality_decides_only_among_the_placements_that_fit() -> None:
    # c1 holds everything but has 2 free; c2 holds the model with 8 free; c3 holds nothing, 4 free.
    pool = Pool([pod("c1", 2, cached=(MODEL, DATA)), pod("c2", 8, cached=(MODEL,)), pod("c3", 4)])
    assert pool.place(fine_tune(2)) == Placement("c1", ["c1-n0"])  # the most bytes held, and fits
    assert pool.place(fine_tune(4)) == Placement("c2", ["c2-n0"])  # c1 cannot: the next holder
    pool.take(Placement("c2", ["c2-n0"]), 6)
    assert pool.place(fine_tune(4)) == Placement("c3", ["c3-n0"])  # no holder fits: plain best fit


def test_more_bytes_held_wins_and_best_fit_breaks_ties() -> None:
    pool = Pool(
        [
            pod("c1", 8, cached=(DATA,)),
            pod("c2", 8, cached=(MODEL,)),
            pod("c3", 3, cached=(MODEL, OTHER)),
            pod("c4", 2),
        ]
    )
    # c2 and c3 both hold the 16 GiB model (more than c1's 1 GiB file): the tighter c3 of the two.
    assert pool.place(fine_tune(2)) == Placement("c3", ["c3-n0"])
    # Only the data file: c1 holds it.
    assert pool.place(Need(PRODUCT, 2, 1, inputs=((DATA, GiB),))) == Placement("c1", ["c1-n0"])
    # Inputs nobody holds, or of no size: plain best fit.
    assert pool.place(Need(PRODUCT, 2, 1, inputs=(("d" * 64, GiB),))) == Placement("c4", ["c4-n0"])
    assert pool.place(Need(PRODUCT, 2, 1, inputs=((MODEL, 0),))) == Placement("c4", ["c4-n0"])


def test_multi_node_jobs_prefer_the_holder_among_cpods_with_enough_nodes() -> None:
    pool = Pool([pod("c1", 4, 4), pod("c2", 8, 8, cached=(MODEL,)), pod("c3", 8, cached=(MODEL, DATA))])
    # c3 holds more but has one node: the two-node job goes to c2, not to best-fit c1.
    assert pool.place(fine_tune(4, nodes=2)) == Placement("c2", ["c2-n0", "c2-n1"])
    assert pool.place(Need(PRODUCT, 4, 2)) == Placement("c1", ["c1-n0", "c1-n1"])


def test_the_other_rules_still_hold_for_holders() -> None:
    pool = Pool(
        [
            pod("c1", 8),
            pod("c2", 8, cached=(MODEL, DATA)),
            CPodCapacity(
                "c3",
                [NodeCapacity("h", H100, 8, 8)],
                runtime="local",
                takes_fine_tunes=True,
                cached=frozenset({MODEL, DATA}),
            ),
        ]
    )
    pool.cpods["c2"].takes_only = frozenset({"provider"})
    # c2 takes only its provider's jobs; c3 offers another product.
    assert pool.place(fine_tune(owner_id="someone")) == Placement("c1", ["c1-n0"])
    assert pool.place(fine_tune(owner_id="provider")) == Placement("c2", ["c2-n0"])
    any_product = Need(None, 2, 1, inputs=INPUTS, trainer=True, owner_id="someone")
    assert pool.place(any_product) == Placement("c3", ["h"])
    assert pool.place(any_product, frozenset({PRODUCT})) == Placement("c1", ["c1-n0"])  # H100 unpriced
    # A job pinned to a CPod goes there, whoever holds its inputs.
    assert pool.place(fine_tune(cpod_id="c1", owner_id="x")) == Placement("c1", ["c1-n0"])


def test_a_replaced_cpod_is_held_by_what_it_holds_now() -> None:
    pool = Pool([pod("c1", 2), pod("c2", 8, cached=(MODEL,))])
    pool.put(pod("c2", 8))  # its next heartbeat: the model evicted
    pool.put(pod("c3", 8, cached=(MODEL,)))
    assert pool.place(fine_tune()) == Placement("c3", ["c3-n0"])
    pool.remove("c3")
    assert pool.place(fine_tune()) == Placement("c1", ["c1-n0"])


def test_inputs_and_fine_tunes_go_only_to_cpods_that_take_them() -> None:
    kube = pod("k1", 2, cached=(MODEL, DATA), runtime="kubernetes")
    pool = Pool([kube, pod("l1", 8)])
    assert pool.place(fine_tune()) == Placement("l1", ["l1-n0"])
    assert pool.place(Need(PRODUCT, 2, 1, trainer=True)) == Placement("l1", ["l1-n0"])
    assert pool.place(Need(PRODUCT, 2, 1, inputs=((DATA, GiB),))) == Placement("l1", ["l1-n0"])
    assert pool.place(Need(PRODUCT, 2, 1)) == Placement("k1", ["k1-n0"])  # an ordinary job: best fit
    only_kube = Pool([kube])
    for need in (fine_tune(), Need(PRODUCT, 2, 1, trainer=True), fine_tune(cpod_id="k1")):
        assert only_kube.place(need) is None
    assert english(why_not(fine_tune(), [kube], None)) == (
        f"the CPods that offer 2 × {PRODUCT} do not run fine-tunes (a Kubernetes CPod needs its "
        "agent's --trainer-image): wait for one that does"
    )
    # A Kubernetes CPod whose agent has a trainer image takes them, and its cache counts as any.
    trainer = CPodCapacity("k2", kube.nodes, runtime="kubernetes", takes_fine_tunes=True)
    assert Pool([trainer]).place(fine_tune()) == Placement("k2", ["k1-n0"])
    # One that serves its input cache (--serve-inputs) and holds the inputs wins over a tighter fit.
    roomy = pod("k3", 8).nodes
    holder = CPodCapacity(
        "k3", roomy, runtime="kubernetes", takes_fine_tunes=True, cached=frozenset((MODEL, DATA))
    )
    assert Pool([pod("l2", 2), holder]).place(fine_tune()) == Placement("k3", ["k3-n0"])
    bare = CPodCapacity("k4", roomy, runtime="kubernetes", takes_fine_tunes=True)  # holds nothing
    assert Pool([pod("l2", 2), bare]).place(fine_tune()) == Placement("l2", ["l2-n0"])  # best fit


# ---- scheduling passes against a database -------------------------------------------------------------

PROVIDER, ALICE, BOB = "p" * 32, "u" * 32, "v" * 32
NEAR, FAR, KUBE = "n" * 32, "f" * 32, "k" * 32  # FAR sorts first: best fit's tie goes to it


@pytest.fixture
def ctx(make_settings: MakeSettings) -> Iterator[CloudContext]:
    settings: Settings = make_settings()
    context = CloudContext.from_settings(settings)
    migrate.upgrade(context.db.engine)
    with context.db.session() as session:
        session.execute(
            insert(User),
            [
                {"id": i, "email": f"{i[0]}@example.com", "password_hash": "x", "role": r}
                for i, r in ((PROVIDER, Role.PROVIDER), (ALICE, Role.USER), (BOB, Role.USER))
            ],
        )
    yield context
    context.db.dispose()


def add_cpod(ctx: CloudContext, cpod_id: str, free: int, runtime: str = "local", **values: Any) -> None:
    with ctx.db.session() as session:
        session.execute(
            insert(CPod).values(
                id=cpod_id,
                owner_id=PROVIDER,
                name=cpod_id[:8],
                cluster_uid=cpod_id,
                runtime=runtime,
                agent_version="t",
                token_hash=cpod_id,
                status=CPodStatus.ONLINE,
                last_seq=1,
                last_heartbeat_at=utcnow(),
                heartbeat_interval_s=30.0,
                nodes=[gpu_node("w1", count=8, used=8 - free)],
                reported_jobs=[],
                takes_fine_tunes=runtime == "local",
                **values,
            )
        )


def cache_beat(ctx: CloudContext, cpod_id: str, *sha256: str) -> None:
    """A heartbeat that reports a new cache (the version moves, as every beat moves it)."""
    with ctx.db.session() as session:
        session.execute(
            update(CPod)
            .where(CPod.id == cpod_id)
            .values(
                last_seq=CPod.last_seq + 1,
                last_heartbeat_at=utcnow(),
                cached_inputs=[{"sha256": s, "size": GiB} for s in sha256],
            )
        )


def submit(ctx: CloudContext, job_id: str, owner: str, gpus: int, *, fine_tune: bool = False) -> None:
    inputs = [
        {"name": name, "sha256": sha, "size": size, "object": {"job_id": "models", "attempt": 0, "path": sha}}
        for name, (sha, size) in zip(("model", "train"), INPUTS, strict=True)
    ]
    with ctx.db.session() as session:
        session.execute(
            insert(Job).values(
                id=job_id.ljust(32, "0"),
                owner_id=owner,
                name=job_id,
                command=["sxwl-trainer"] if fine_tune else ["true"],
                env={},
                gpu_product=PRODUCT,
                gpus_per_node=gpus,
                nodes=1,
                state=JobState.QUEUED,
                node_names=[],
                inputs=inputs if fine_tune else [],
                trainer={"seed": 1} if fine_tune else None,
            )
        )


def where(ctx: CloudContext) -> dict[str, tuple[str | None, str | None]]:
    """Each job's CPod and reason."""
    with ctx.db.session() as session:
        return {
            name: (cpod, english(reason))
            for name, cpod, reason in session.execute(select(Job.name, Job.cpod_id, Job.reason))
        }


def test_a_pass_sends_the_fine_tune_to_the_holder_and_follows_its_cache(ctx: CloudContext) -> None:
    add_cpod(ctx, FAR, 8)
    add_cpod(ctx, NEAR, 8, cached_inputs=[{"sha256": MODEL, "size": 16 * GiB}])
    submit(ctx, "plain", ALICE, 4)
    submit(ctx, "tune1", ALICE, 2, fine_tune=True)
    scheduler.schedule_once(ctx)
    placed = where(ctx)
    assert placed["plain"][0] == FAR and placed["tune1"][0] == NEAR
    # NEAR evicts the model: the warm capacity cache sees it, and best fit decides (FAR, 4 free).
    cache_beat(ctx, NEAR)
    submit(ctx, "tune2", ALICE, 2, fine_tune=True)
    scheduler.schedule_once(ctx)
    assert where(ctx)["tune2"][0] == FAR
    cache_beat(ctx, NEAR, MODEL)  # fetched again
    submit(ctx, "tune3", ALICE, 2, fine_tune=True)
    scheduler.schedule_once(ctx)
    assert where(ctx)["tune3"][0] == NEAR  # though FAR, with 2 free, is the tighter fit


def test_locality_never_reorders_the_queue(ctx: CloudContext) -> None:
    """Room for one 8-GPU job, on the CPod that holds the fine-tune's model: the job queued before it
    takes that room, and the one of the user with fewer GPUs in use goes first, inputs or not."""
    add_cpod(ctx, NEAR, 8, cached_inputs=[{"sha256": MODEL, "size": 16 * GiB}])
    add_cpod(ctx, FAR, 0)
    submit(ctx, "a-plain", ALICE, 8)
    submit(ctx, "a-tune", ALICE, 8, fine_tune=True)
    scheduler.schedule_once(ctx)
    placed = where(ctx)
    assert placed["a-plain"][0] == NEAR
    assert placed["a-tune"] == (None, f"waiting for 8 × {PRODUCT} to become free")


def test_fair_share_comes_before_locality(ctx: CloudContext) -> None:
    add_cpod(ctx, NEAR, 4, cached_inputs=[{"sha256": MODEL, "size": 16 * GiB}])
    add_cpod(ctx, FAR, 4)
    submit(ctx, "a-held", ALICE, 4)
    scheduler.schedule_once(ctx)
    assert where(ctx)["a-held"][0] == FAR  # best fit's tie: the lower id
    submit(ctx, "a-tune", ALICE, 4, fine_tune=True)  # Alice holds 4 GPUs, Bob none: Bob goes first
    submit(ctx, "b-plain", BOB, 4)
    scheduler.schedule_once(ctx)
    placed = where(ctx)
    assert placed["b-plain"][0] == NEAR
    assert placed["a-tune"] == (None, f"waiting for 4 × {PRODUCT} to become free")


def test_a_fine_tune_waits_for_a_cpod_that_takes_fine_tunes(ctx: CloudContext) -> None:
    add_cpod(ctx, KUBE, 4, runtime="kubernetes", cached_inputs=[{"sha256": MODEL, "size": 16 * GiB}])
    submit(ctx, "tune", ALICE, 2, fine_tune=True)
    submit(ctx, "plain", ALICE, 1)
    scheduler.schedule_once(ctx)
    placed = where(ctx)
    assert placed["plain"][0] == KUBE
    assert placed["tune"][0] is None and "--trainer-image" in str(placed["tune"][1])
    # Its agent restarts with a trainer image and says so: the next pass sees the change.
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id == KUBE).values(takes_fine_tunes=True))
    scheduler.schedule_once(ctx)
    assert where(ctx)["tune"][0] == KUBE


# ---- the heartbeat's cache ----------------------------------------------------------------------------


def stored_cache(client: TestClient, cpod_id: str) -> list[CachedRow]:
    with ctx_of(client).db.session() as session:
        return list(session.scalars(select(CPod.cached_inputs).where(CPod.id == cpod_id)).one())


def test_a_beat_with_a_cache_stores_it_one_without_keeps_it_an_empty_one_clears_it(
    client: TestClient,
) -> None:
    _, key = provider(client)
    reg = register_cpod(client, key)
    token, cpod_id = reg["cpod_token"], reg["cpod_id"]
    cache = [{"sha256": MODEL, "size": 16 * GiB}, {"sha256": DATA, "size": 123}]
    assert stored_cache(client, cpod_id) == []
    assert beat(client, token, 1, [gpu_node("n1")], cache=cache).json()["accepted"]
    assert stored_cache(client, cpod_id) == cache
    assert beat(client, token, 2, [gpu_node("n1")]).json()["accepted"]
    assert stored_cache(client, cpod_id) == cache
    stale = beat(client, token, 2, [gpu_node("n1")], cache=[]).json()  # a replay changes nothing
    assert not stale["accepted"] and stored_cache(client, cpod_id) == cache
    bad = beat(client, token, 3, [gpu_node("n1")], cache=[{"sha256": "not-hex", "size": 1}])
    assert bad.status_code == 422 and "cache" in bad.text
    assert stored_cache(client, cpod_id) == cache
    assert beat(client, token, 3, [gpu_node("n1")], cache=[]).json()["accepted"]
    assert stored_cache(client, cpod_id) == []


def hb(seq: int, **extra: Any) -> Heartbeat:
    return Heartbeat.model_validate({"seq": seq, "nodes": [gpu_node("n1")], **extra})


def test_beats_without_a_cache_are_still_one_update_and_a_batch_keeps_the_last_cache(
    client: TestClient,
) -> None:
    _, key = provider(client)
    a, b = register_cpod(client, key, "cluster-a"), register_cpod(client, key, "cluster-b")
    ctx = ctx_of(client)
    updates: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("UPDATE cpods"):
            updates.append(statement)

    event.listen(ctx.db.engine, "before_cursor_execute", count)
    try:
        with ctx.db.session() as session:
            heartbeats.apply(session, [Beat.of(a["cpod_token"], hb(1)), Beat.of(b["cpod_token"], hb(1))])
        plain = len(updates)
        updates.clear()
        with ctx.db.session() as session:
            outcomes = heartbeats.apply(
                session,
                [
                    Beat.of(a["cpod_token"], hb(2, cache=[{"sha256": OTHER, "size": 1}])),
                    Beat.of(a["cpod_token"], hb(3, cache=[{"sha256": MODEL, "size": 2}])),
                    Beat.of(a["cpod_token"], hb(4)),  # unchanged since seq 3
                    Beat.of(b["cpod_token"], hb(2)),
                ],
            )
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", count)
    assert plain == 1  # one (multi-row) statement for the common case
    assert len(updates) == 2  # and one more for the beats with a cache
    assert all(isinstance(o, HeartbeatReply) and o.accepted for o in outcomes)
    assert stored_cache(client, a["cpod_id"]) == [{"sha256": MODEL, "size": 2}]
    assert stored_cache(client, b["cpod_id"]) == []


def test_a_cache_is_not_written_over_a_newer_beat_of_another_replica(client: TestClient) -> None:
    _, key = provider(client)
    reg = register_cpod(client, key)
    ctx = ctx_of(client)
    fired: list[bool] = []

    def other_replica(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not fired and statement.startswith("UPDATE cpods SET") and "nodes=" in statement:
            fired.append(True)
            conn.execute(
                update(CPod)
                .where(CPod.id == reg["cpod_id"])
                .values(last_seq=9, cached_inputs=[{"sha256": DATA, "size": 5}])
            )

    event.listen(ctx.db.engine, "before_cursor_execute", other_replica)
    try:
        with ctx.db.session() as session:
            (outcome,) = heartbeats.apply(
                session, [Beat.of(reg["cpod_token"], hb(2, cache=[{"sha256": MODEL, "size": 2}]))]
            )
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", other_replica)
    assert fired and isinstance(outcome, HeartbeatReply) and not outcome.accepted
    assert stored_cache(client, reg["cpod_id"]) == [{"sha256": DATA, "size": 5}]
