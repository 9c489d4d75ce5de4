"""Heartbeats, applied in batches: one token lookup, one multi-row update and one commit for all the
heartbeats that arrived together, so the database work per heartbeat shrinks as the load grows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, CPodStatus, JobAttempt
from sxwl.cloud.db.types import EncodedJSON, utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.groupcommit import GroupCommit
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.fleet import cpod_tokens
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.cloud.services.fleet.cpods import add_event, counted
from sxwl.cloud.services.fleet.engine_loads import EngineLoads
from sxwl.protocol import HeartbeatReply, split_attempt_key

_CPODS: Table = CPod.__table__  # type: ignore[assignment]  # a mapped class's table is a Table
# Conditional on the sequence number: a delayed or replayed heartbeat never overwrites a newer one.
_APPLY = (
    update(_CPODS)
    .where(
        _CPODS.c.id == bindparam("b_id"),
        _CPODS.c.last_seq < bindparam("b_seq"),
        _CPODS.c.revoked_at.is_(None),
    )
    .values(
        nodes=bindparam("b_nodes", type_=_CPODS.c.nodes.type),
        last_seq=bindparam("b_seq"),
        last_heartbeat_at=bindparam("b_now", type_=_CPODS.c.last_heartbeat_at.type),
        status=CPodStatus.ONLINE.value,
        reported_jobs=bindparam("b_reported", type_=_CPODS.c.reported_jobs.type),
    )
)
# Most beats carry no cache (agents report it when it changed), so it is not part of _APPLY: a beat
# that carries one adds this statement, matching only a row that now holds the batch's last beat of
# that CPod (a newer beat written by another replica meanwhile wins, and this batch's is refused).
_CACHE = (
    update(_CPODS)
    .where(_CPODS.c.id == bindparam("b_id"), _CPODS.c.last_seq == bindparam("b_seq"))
    .values(cached_inputs=bindparam("b_cache", type_=_CPODS.c.cached_inputs.type))
)
_ATTEMPTS: Table = JobAttempt.__table__  # type: ignore[assignment]
_PROVEN = (
    update(_ATTEMPTS)
    .where(
        _ATTEMPTS.c.job_id == bindparam("b_job"),
        _ATTEMPTS.c.attempt == bindparam("b_attempt"),
        _ATTEMPTS.c.finished_at.is_(None),
        _ATTEMPTS.c.started_at.is_not(None),
    )
    .values(proven_until=bindparam("b_at", type_=_ATTEMPTS.c.proven_until.type))
)
# Built once (the statement and its compiled form are reused by every batch); Core, not ORM rows.
_HOLDERS = select(
    _CPODS.c.id,
    _CPODS.c.token_hash,
    _CPODS.c.heartbeat_interval_s,
    _CPODS.c.status,
    _CPODS.c.last_seq,
    _CPODS.c.reported_jobs,
    _CPODS.c.last_heartbeat_at,
).where(*cpod_tokens.live(bindparam("hashes", expanding=True)))


@dataclass
class _Holder:
    """What the cloud holds for one CPod, as this batch moves it along."""

    cpod_id: str
    interval_s: float
    status: CPodStatus
    last_seq: int
    reported_jobs: list[str]
    last_heartbeat_at: datetime | None


Outcome = HeartbeatReply | AppError


def writer(ctx: CloudContext) -> GroupCommit[Beat, HeartbeatReply]:
    """This process's heartbeat writer: beats that arrive together share a transaction."""

    def write(beats: Sequence[Beat]) -> list[Outcome]:
        with ctx.db.session() as session:
            return apply(session, beats, ctx.engine_loads)

    return GroupCommit(write)


def apply(session: Session, beats: Sequence[Beat], loads: EngineLoads | None = None) -> list[Outcome]:
    """Authenticates and applies ``beats`` in order; one outcome per beat. Beats of one CPod in one
    batch are applied in turn, exactly as if they had come one by one. ``loads``: where the engines'
    loads an accepted beat carries are kept."""
    hashes = {b.token: hashed for b in beats if (hashed := cpod_tokens.hash_of(b.token)) is not None}
    holders = {
        row.token_hash: _Holder(
            row.id,
            row.heartbeat_interval_s,
            row.status,
            row.last_seq,
            row.reported_jobs,
            row.last_heartbeat_at,
        )
        for row in session.connection().execute(_HOLDERS, {"hashes": list(set(hashes.values()))})
    }
    now = utcnow()
    outcomes: list[Outcome] = []
    rows: list[dict[str, object]] = []
    came_online: list[int] = []  # indexes of the beats that bring their CPod online
    dropped: list[dict[str, object]] = []  # attempts a beat no longer lists: their last proof
    caches: dict[str, EncodedJSON] = {}  # per CPod, the last cache an accepted beat reported
    wake = False
    for beat in beats:
        holder = holders.get(hashes.get(beat.token, ""))
        if holder is None:
            outcomes.append(cpod_tokens.refusal(session, beat.token))
            continue
        if beat.claimed_cpod_id is not None and beat.claimed_cpod_id != holder.cpod_id:
            outcomes.append(AppError(403, "this token belongs to another CPod", code="wrong_cpod"))
            continue
        if beat.seq <= holder.last_seq:
            outcomes.append(_reply(holder, accepted=False))
            continue
        rows.append(
            {
                "b_id": holder.cpod_id,
                "b_seq": beat.seq,
                "b_nodes": beat.nodes,
                "b_now": now,
                "b_reported": beat.reported_jobs,
            }
        )
        if holder.status != CPodStatus.ONLINE:
            came_online.append(len(outcomes))
        # New capacity, or jobs that came or went, wake the scheduler. Other changes (GPUs used
        # outside sxwl, say) are seen by its periodic pass; waking it on every heartbeat would cost a
        # pass each.
        wake = wake or holder.status != CPodStatus.ONLINE or beat.reported_jobs != holder.reported_jobs
        if holder.last_heartbeat_at is not None and beat.reported_jobs != holder.reported_jobs:
            for key in set(holder.reported_jobs) - set(beat.reported_jobs):
                if (held := split_attempt_key(key)) is not None:
                    dropped.append({"b_job": held[0], "b_attempt": held[1], "b_at": holder.last_heartbeat_at})
        if beat.cache is not None:
            caches[holder.cpod_id] = beat.cache
        holder.status, holder.last_seq, holder.reported_jobs = CPodStatus.ONLINE, beat.seq, beat.reported_jobs
        holder.last_heartbeat_at = now
        outcomes.append(_reply(holder, accepted=True))
    if rows:
        # In the order of the ids, as the liveness sweep does: neither waits on the other's rows.
        rows.sort(key=lambda row: str(row["b_id"]))
        applied = session.connection().execute(_APPLY, rows).rowcount
        if caches:  # before _recheck, which moves the holders to what another replica wrote
            seqs = {h.cpod_id: h.last_seq for h in holders.values()}
            session.connection().execute(
                _CACHE,
                [
                    {"b_id": cpod_id, "b_seq": seqs[cpod_id], "b_cache": cache}
                    for cpod_id, cache in sorted(caches.items())
                ],
            )
        if applied != len(rows):
            _recheck(session, beats, outcomes, holders, hashes)
        if dropped:
            # The heartbeat before this one was the last to prove these attempts alive.
            session.connection().execute(_PROVEN, dropped)
        for index in came_online:
            outcome = outcomes[index]
            if isinstance(outcome, HeartbeatReply) and outcome.accepted:
                add_event(
                    session,
                    holders[hashes[beats[index].token]].cpod_id,
                    "online",
                    counted("cpod.nodes", beats[index].node_count),
                )
    if loads is not None:
        for beat, outcome in zip(beats, outcomes, strict=True):
            if isinstance(outcome, HeartbeatReply) and outcome.accepted:
                loads.record(holders[hashes[beat.token]].cpod_id, beat.loads, now)
    if wake:
        on_commit(session).wake_scheduler()
    return outcomes


def _reply(holder: _Holder, *, accepted: bool) -> HeartbeatReply:
    return HeartbeatReply(
        heartbeat_interval_s=holder.interval_s,
        accepted=accepted,
        last_seq=holder.last_seq,
        status=holder.status.value,
    )


def _recheck(
    session: Session,
    beats: Sequence[Beat],
    outcomes: list[Outcome],
    holders: dict[str, _Holder],
    hashes: dict[str, str],
) -> None:
    """Some updates matched no row: another replica applied a newer heartbeat, or the CPod was revoked,
    after this batch read the rows. The database decides: a beat was accepted when the cloud now holds
    exactly it; the others are answered with what the cloud holds, so their agents go on after it."""
    by_id = {h.cpod_id: h for h in holders.values()}
    revoked: set[str] = set()
    for cpod_id, status, last_seq, revoked_at in session.execute(
        select(CPod.id, CPod.status, CPod.last_seq, CPod.revoked_at).where(CPod.id.in_(list(by_id)))
    ):
        by_id[cpod_id].status, by_id[cpod_id].last_seq = status, last_seq
        if revoked_at is not None:
            revoked.add(cpod_id)
    for index, beat in enumerate(beats):
        outcome = outcomes[index]
        if not isinstance(outcome, HeartbeatReply) or not outcome.accepted:
            continue
        holder = holders[hashes[beat.token]]
        if holder.cpod_id in revoked:
            outcomes[index] = cpod_tokens.refusal(session, beat.token)
        elif holder.last_seq != beat.seq:
            outcomes[index] = _reply(holder, accepted=False)
