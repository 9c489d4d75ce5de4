"""GPU time offered: each online CPod's allocatable GPUs, counted per UTC day and product from
its heartbeats, so a provider sees utilisation (GPU-hours sold ÷ offered). Like usage, offered
time runs only up to the last heartbeat, and restarts when the CPod comes back online: time it was
unknown or offline offers nothing."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, CPodEvent, CPodStatus
from sxwl.cloud.db.money_models import GpuOffer
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money.gpu_summary import summarize

_US = timedelta(microseconds=1)
_CHUNK = 1000  # ids per IN list
_CPODS = cast(Table, CPod.__table__)
_MOVE = (
    update(_CPODS)
    .where(_CPODS.c.id == bindparam("b_id"))
    .values(offered_until=bindparam("b_to", type_=_CPODS.c.offered_until.type))
)


def account_once(ctx: CloudContext, now: datetime | None = None) -> int:
    """Counts the GPU time each online CPod offered since the last count; the CPods counted."""
    now = now or utcnow()
    with ctx.db.session(immediate=True) as session:
        stmt = select(CPod.id, CPod.nodes, CPod.last_heartbeat_at, CPod.offered_until).where(
            CPod.status == CPodStatus.ONLINE,
            CPod.revoked_at.is_(None),
            CPod.last_heartbeat_at.is_not(None),
            # A row counted up to its last heartbeat or past it (offered_until >= last >= end, end
            # = min(last, now)) adds nothing and moves nothing below: the back-online time only
            # raises `since`. So a CPod with no heartbeat since the last pass costs no read.
            or_(CPod.offered_until.is_(None), CPod.offered_until < CPod.last_heartbeat_at),
        )
        if session.get_bind().dialect.name == "postgresql":
            # Another replica counting holds some rows; heartbeats wait at most one short pass.
            stmt = stmt.with_for_update(of=CPod, skip_locked=True)
        rows = session.execute(stmt.order_by(CPod.id)).all()
        back_online = _back_online(session, [cpod_id for cpod_id, *_ in rows])
        adds: dict[tuple[str, str, str], int] = defaultdict(int)
        moves: list[dict[str, Any]] = []
        for cpod_id, nodes, last, since in rows:
            assert last is not None  # the query reads only CPods that beat
            end = min(last, now)
            if since is not None and (online := back_online.get(cpod_id)) is not None:
                since = max(since, online)
            if since is not None and since < end:
                for line in summarize(nodes):
                    if line.allocatable:
                        adds[(cpod_id, end.strftime("%Y-%m-%d"), line.product)] += line.allocatable * (
                            (end - since) // _US
                        )
            if since is None or since < end:
                moves.append({"b_id": cpod_id, "b_to": end})
        if moves:
            session.execute(_MOVE, moves)
        _add(session, adds)
        return len(moves)


def _back_online(session: Session, cpod_ids: list[str]) -> dict[str, datetime]:
    """When each of these CPods last came back online (its latest "online" event)."""
    found: dict[str, datetime] = {}
    for start in range(0, len(cpod_ids), _CHUNK):
        rows = session.execute(
            select(CPodEvent.cpod_id, func.max(CPodEvent.at))
            .where(CPodEvent.kind == "online", CPodEvent.cpod_id.in_(cpod_ids[start : start + _CHUNK]))
            .group_by(CPodEvent.cpod_id)
        )
        found.update((cpod_id, at) for cpod_id, at in rows)
    return found


def _add(session: Session, adds: dict[tuple[str, str, str], int]) -> None:
    if not adds:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(GpuOffer)
    stmt = stmt.on_conflict_do_update(
        index_elements=["cpod_id", "day", "gpu_product"],
        set_={"gpu_us": GpuOffer.gpu_us + stmt.excluded.gpu_us},
    )
    session.execute(
        stmt,
        [{"cpod_id": c, "day": d, "gpu_product": p, "gpu_us": us} for (c, d, p), us in sorted(adds.items())],
    )


def offered_hours(session: Session, cpod_ids: list[str], start: datetime, end: datetime) -> dict[str, float]:
    """GPU-hours offered per product by ``cpod_ids`` between two days."""
    rows = session.execute(
        select(GpuOffer.gpu_product, func.sum(GpuOffer.gpu_us))
        .where(
            GpuOffer.cpod_id.in_(cpod_ids),
            GpuOffer.day >= start.strftime("%Y-%m-%d"),
            GpuOffer.day < end.strftime("%Y-%m-%d"),
        )
        .group_by(GpuOffer.gpu_product)
    ).all()
    return {product: int(us or 0) / 3_600_000_000 for product, us in rows}
