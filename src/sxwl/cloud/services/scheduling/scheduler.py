"""One scheduling pass: order the queue (priority, fair share, FIFO), place what fits, assign each
job with one conditional update (invariant 3, docs/architecture.md), move a dev environment that waits
for a full or offline CPod to one with room where it may (moves.py), and say why the rest waits."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import String, Table, bindparam, insert, select, type_coerce, update
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import locks
from sxwl.cloud.db.json_rows import StoredInput
from sxwl.cloud.db.models import REASON_CHARS, CPod, Job, JobAttempt, JobEvent, JobState, User
from sxwl.cloud.db.money_models import PriceResource
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.money import ledger
from sxwl.cloud.services.money.prices import FREE, PriceBook, Rate, cpu_units, price_book
from sxwl.cloud.services.scheduling import moves
from sxwl.cloud.services.scheduling.capacity import CapacityCache, Hold
from sxwl.cloud.services.scheduling.placement import Need, Placement, Pool, never_fits, why_not
from sxwl.protocol.money import yuan_text
from sxwl.protocol.reasons import Reason


@dataclass(frozen=True)
class Assigned:
    job_id: str
    cpod_id: str
    attempt: int


@dataclass(frozen=True)
class Queued:
    """The columns of a queued job that a pass needs (not its command or env)."""

    id: str
    owner_id: str
    priority: int
    created_at: datetime
    attempt: int
    reason: str | None  # as stored (Reason.stored): compared, not read, on every pass
    gpu_product: str | None
    gpus_per_node: int
    nodes: int
    pinned_cpod_id: str | None
    image: str | None
    inputs: list[StoredInput]
    trainer: dict[str, Any] | None
    dev_env_id: str | None
    engine: dict[str, Any] | None
    cpus: int | None
    memory_mib: int | None


_QUEUED_COLUMNS = (
    Job.id,
    Job.owner_id,
    Job.priority,
    Job.created_at,
    Job.attempt,
    type_coerce(Job.reason, String).label("reason"),
    Job.gpu_product,
    Job.gpus_per_node,
    Job.nodes,
    Job.pinned_cpod_id,
    Job.image,
    Job.inputs,
    Job.trainer,
    Job.dev_env_id,
    Job.engine,
    Job.cpus,
    Job.memory_mib,
)


class _InQueue(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def owner_id(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def created_at(self) -> datetime: ...


J = TypeVar("J", bound=_InQueue)


def fair_order(queued: Sequence[J], usage: dict[str, int]) -> list[J]:
    """Priority first; within a priority, users take turns (least GPUs in use first), each user's
    jobs in submission order. A user with 1,000 queued jobs does not starve one with a single job."""
    ordered: list[J] = []
    by_priority = itertools.groupby(sorted(queued, key=lambda j: -j.priority), key=lambda j: j.priority)
    for _, group in by_priority:
        per_user: dict[str, list[J]] = defaultdict(list)
        for job in sorted(group, key=lambda j: (j.created_at, j.id)):
            per_user[job.owner_id].append(job)
        users = sorted(per_user, key=lambda u: (usage.get(u, 0), per_user[u][0].created_at))
        for round_ in itertools.zip_longest(*(per_user[u] for u in users)):
            ordered.extend(job for job in round_ if job is not None)
    return ordered


def schedule_once(ctx: CloudContext) -> list[Assigned]:
    """Passes run one at a time, across threads and replicas: a pass that read capacity before
    another pass committed would hand out the same free GPUs twice."""
    cache = ctx.capacity
    with cache.lock, _one_pass_at_a_time(ctx):
        return _pass(ctx, cache)


@contextlib.contextmanager
def _one_pass_at_a_time(ctx: CloudContext) -> Iterator[None]:
    """A file lock beside a SQLite database; on PostgreSQL the pass's transaction takes an advisory
    lock instead (see ``_pass``)."""
    if ctx.db.engine.dialect.name != "sqlite":
        yield
        return
    with locks.beside_sqlite(ctx.db.engine.url.render_as_string(hide_password=False), "scheduler"):
        yield


@dataclass
class _Writes:
    """What a pass decided, written in a few batched statements at its end instead of three
    statements (and a flush) per job."""

    assigned: list[tuple[Queued, Placement]]
    reasons: list[tuple[str, str]]  # (job id, reason as stored)
    # The price each placement is made at (fixed on its attempt: invariant 9, docs/architecture.md).
    priced: dict[str, tuple[PriceResource, str | None, Rate]]
    moved: dict[str, moves.Move] = dataclasses.field(default_factory=dict)  # by job id


def _pass(ctx: CloudContext, cache: CapacityCache) -> list[Assigned]:
    with ctx.db.session() as session:
        if session.get_bind().dialect.name == "postgresql":
            locks.advisory_in_transaction(session.connection(), locks.SCHEDULER_KEY)
        queued = [
            Queued(**row._asdict())
            for row in session.execute(
                select(*_QUEUED_COLUMNS)
                .where(Job.state == JobState.QUEUED)
                .order_by(Job.priority.desc(), Job.created_at)
                .limit(ctx.settings.scheduler_batch)
            )
        ]
        if not queued:
            return []
        pool = cache.refresh(session)
        writes = _decide(ctx, session, queued, pool, cache.usage(), price_book(session))
        won = _write(session, writes)
        for job, placement in won:
            on_commit(session).wake_cpod(placement.cpod_id)
            on_commit(session).wake_job(job.id)
    # Committed: later passes of this process need not read these placements back.
    for job, placement in won:
        cache.hold(
            (job.id, job.attempt + 1),
            Hold(
                placement.cpod_id,
                tuple(placement.node_names),
                job.gpus_per_node,
                job.owner_id,
                job.cpus or 0,
                job.memory_mib or 0,
            ),
        )
    return [Assigned(job.id, placement.cpod_id, job.attempt + 1) for job, placement in won]


def _decide(
    ctx: CloudContext,
    session: Session,
    queued: list[Queued],
    pool: Pool,
    usage: dict[str, int],
    book: PriceBook,
) -> _Writes:
    owners = {j.owner_id for j in queued}
    limits: dict[str, int | None] = {
        user_id: limit
        for user_id, limit in session.execute(select(User.id, User.max_gpus).where(User.id.in_(owners)))
    }
    billing = ctx.settings.billing_enabled
    cash = ledger.balances(session, ledger.USER_CASH, owners) if billing else {}
    priced_products = frozenset(book.gpu) if billing else None
    writes = _Writes([], [], {})
    # Capacity only shrinks during a pass: a need that did not fit once will not fit again.
    unplaceable: dict[Need, Reason] = {}
    never: dict[Need, Reason | None] = {}
    leavers: dict[str, StoredInput] | None = None  # read when a pinned job first finds no room
    restricted = pool.restricted
    for job in fair_order(queued, usage):
        need = Need(
            job.gpu_product,
            job.gpus_per_node,
            job.nodes,
            job.pinned_cpod_id,
            image=bool(job.image),
            owner_id=job.owner_id if restricted else None,
            inputs=input_sizes(job.inputs),
            trainer=job.trainer is not None,
            dev_env=job.dev_env_id is not None,
            engine=job.engine is not None,
            cpus=job.cpus,
            memory_mib=job.memory_mib,
        )
        total = job.gpus_per_node * job.nodes
        limit = limits.get(job.owner_id) or ctx.settings.default_user_max_gpus
        held = usage.get(job.owner_id, 0)
        if limit and held + total > limit:
            _explain(writes, job, Reason.of("queue.limit", limit=limit, used=held))
            continue
        pinned_online = job.pinned_cpod_id in pool.cpods if job.pinned_cpod_id else None
        balance = cash.get(job.owner_id, 0)
        unpriced = _unpriced(job, book) if billing else None
        if billing and (balance <= 0 or unpriced):
            # Capacity first: a job no CPod could ever run says so, not that it waits for money.
            if need not in never:
                never[need] = never_fits(need, pool.cpods.values(), pinned_online)
            if blocker := never[need]:
                _explain(writes, job, blocker)
                continue
        if billing and balance <= 0:
            _explain(writes, job, Reason.of("queue.top_up", balance=yuan_text(balance)))
            continue
        if unpriced:
            _explain(writes, job, unpriced)
            continue
        placement = None if need in unplaceable else pool.place(need, priced_products)
        if placement is None and job.pinned_cpod_id:  # its CPod is full or offline: may it go elsewhere?
            if leavers is None:
                leavers = moves.leaving(session, [j.id for j in queued if j.pinned_cpod_id])
            if (carried := leavers.get(job.id)) is not None:
                placement = _elsewhere(writes, pool, job, need, carried, priced_products, not pinned_online)
        if placement is None:
            if need not in unplaceable:
                unplaceable[need] = why_not(need, pool.cpods.values(), pinned_online)
            _explain(writes, job, unplaceable[need])
            continue
        pool.take(placement, job.gpus_per_node, job.cpus, job.memory_mib)
        usage[job.owner_id] = held + total
        writes.assigned.append((job, placement))
        product = pool.product_of(placement) if job.gpus_per_node else None
        rate = book.for_product(product) if billing else FREE
        assert rate is not None  # placement took only priced products
        resource = PriceResource.GPU if job.gpus_per_node else PriceResource.CPU
        writes.priced[job.id] = (resource, product, rate)
    return writes


def _elsewhere(
    writes: _Writes,
    pool: Pool,
    job: Queued,
    need: Need,
    carried: StoredInput,
    products: frozenset[str] | None,
    gone: bool,
) -> Placement | None:
    """Where a job pinned to a CPod without room (or offline: ``gone``) goes instead, taking
    ``carried`` along (noted as a move in ``writes``), or None: it keeps waiting for its CPod."""
    assert job.pinned_cpod_id is not None
    inputs = [*job.inputs, carried]
    placement = pool.place(dataclasses.replace(need, cpod_id=None, inputs=input_sizes(inputs)), products)
    if placement is not None:
        move = moves.Move(job.id, job.attempt, job.pinned_cpod_id, placement.cpod_id, inputs, gone)
        writes.moved[job.id] = move
    return placement


def input_sizes(inputs: list[StoredInput]) -> tuple[tuple[str, int], ...]:
    """(sha256, size) once per content: an input listed under two names is held, or not, once."""
    if not inputs:  # most jobs: nothing more to do
        return ()
    return tuple(sorted({i["sha256"]: i["size"] for i in inputs}.items()))


def _unpriced(job: Queued, book: PriceBook) -> Reason | None:
    """Why no price allows placing ``job`` (never a default price), or None."""
    if not job.gpus_per_node:
        return None if book.cpu else Reason.of("queue.no_price_cpu")
    if job.gpu_product is not None and job.gpu_product not in book.gpu:
        return Reason.of("queue.no_price_product", product=job.gpu_product)
    if not book.gpu:
        return Reason.of("queue.no_price_gpu")
    return None


def _explain(writes: _Writes, job: Queued, reason: Reason) -> None:
    stored = reason.stored_within(REASON_CHARS)
    if job.reason != stored:  # write only changes: most passes leave waiting jobs as they are
        writes.reasons.append((job.id, stored))


# Core statements, run as executemany: the ORM's bulk update by primary key takes no extra WHERE.
_JOBS = cast(Table, Job.__table__)

_ASSIGN = (
    update(_JOBS)
    .where(
        _JOBS.c.id == bindparam("b_id"),
        _JOBS.c.state == JobState.QUEUED,
        _JOBS.c.attempt == bindparam("b_attempt"),
    )
    .values(
        state=JobState.ASSIGNED,
        attempt=bindparam("b_next"),
        cpod_id=bindparam("b_cpod"),
        node_names=bindparam("b_nodes", type_=_JOBS.c.node_names.type),
        assigned_at=bindparam("b_at", type_=_JOBS.c.assigned_at.type),
        reason=None,
    )
)

_EXPLAIN = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("b_id"), _JOBS.c.state == JobState.QUEUED)
    .values(reason=bindparam("b_reason", type_=String()))  # already as stored
)


def _attempt_row(
    job: Queued, placement: Placement, writes: _Writes, providers: dict[str, str], now: datetime
) -> dict[str, object]:
    resource, product, rate = writes.priced[job.id]
    gpus = job.gpus_per_node * job.nodes
    return {
        "job_id": job.id,
        "attempt": job.attempt + 1,
        "cpod_id": placement.cpod_id,
        "node_names": placement.node_names,
        "gpus": gpus,
        "assigned_at": now,
        "resource": resource.value,
        # CPU-only work is billed per core it asked for (one per node when it asked for none).
        "units": gpus if resource == PriceResource.GPU else cpu_units(job.cpus, job.nodes),
        "gpu_product": product,
        "price_per_hour": rate.price_per_hour,
        "fee_bp": rate.fee_bp,
        "payer_id": job.owner_id,
        "provider_id": providers.get(placement.cpod_id),
        "rated_done": False,
    }


def _write(session: Session, writes: _Writes) -> list[tuple[Queued, Placement]]:
    """Every assignment stays one conditional update on the job's state and attempt, sent as one
    executemany. The pass holds the scheduler lock, so only a cancel (or a deletion) can win a race
    against it; such jobs are found and left out before their attempt and event rows are written."""
    if writes.reasons:
        session.execute(_EXPLAIN, [{"b_id": job_id, "b_reason": reason} for job_id, reason in writes.reasons])
    if not writes.assigned:
        return []
    now = utcnow()
    moves.unpin(session, list(writes.moved.values()))
    result = session.execute(
        _ASSIGN,
        [
            {
                "b_id": job.id,
                "b_attempt": job.attempt,
                "b_next": job.attempt + 1,
                "b_cpod": placement.cpod_id,
                "b_nodes": placement.node_names,
                "b_at": now,
            }
            for job, placement in writes.assigned
        ],
    )
    won = writes.assigned
    if result.rowcount != len(won):  # type: ignore[attr-defined]
        current = {
            (job_id, attempt)
            for job_id, attempt in session.execute(
                select(Job.id, Job.attempt).where(
                    Job.id.in_([job.id for job, _ in won]), Job.state == JobState.ASSIGNED
                )
            )
        }
        won = [(job, placement) for job, placement in won if (job.id, job.attempt + 1) in current]
    if not won:
        return []
    providers = dict(
        session.execute(select(CPod.id, CPod.owner_id).where(CPod.id.in_({p.cpod_id for _, p in won}))).all()
    )
    session.execute(insert(JobAttempt), [_attempt_row(job, p, writes, providers, now) for job, p in won])
    moves.record(session, [writes.moved[job.id] for job, _ in won if job.id in writes.moved], now)
    session.execute(
        insert(JobEvent),
        [
            {
                "job_id": job.id,
                "attempt": job.attempt + 1,
                "kind": "assigned",
                "detail": Reason.of(
                    "job.placed", cpod=placement.cpod_id, names=", ".join(placement.node_names)
                ),
                "at": now,
            }
            for job, placement in won
        ],
    )
    return won
