"""Read-only view models of the 算力详情 (compute details) and 可用算力 (available GPUs) pages.

Everything here reads; renaming and revoking go through ``sxwl.cloud.services.fleet.cpods``."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.json_rows import NodeRow
from sxwl.cloud.db.models import CPod, CPodEvent, CPodStatus, User
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money.gpu_summary import GpuSummary, add_up, summarize
from sxwl.cloud.web.compute.work import WorkView, work_on
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.cloud.web.jobs.view import size
from sxwl.protocol.reasons import Reason

# How many of a CPod's newest events the page shows.
EVENTS_SHOWN = 20
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class NodeView:
    name: str
    status: str
    gpu_product: str | None
    gpu_memory_mib: int | None
    gpus_total: int
    gpus_allocatable: int
    gpus_used: int
    cpu_cores: int
    memory_mib: int
    reason: str | None = None  # why it is not ready, in its agent's words


@dataclass(frozen=True)
class EventView:
    at: datetime
    kind: str
    detail: Reason | None
    actor: str | None


@dataclass(frozen=True)
class CPodView:
    id: str
    name: str
    owner_email: str
    # online | unknown | offline | revoked (a revoked CPod shows as revoked whatever its last status)
    status: str
    runtime: str
    fine_tunes: bool
    cache_entries: int  # the agent's last reported input cache
    cache_size: str
    agent_version: str
    created_at: datetime
    last_heartbeat_at: datetime | None
    heartbeat_age_s: int | None
    nodes: list[NodeView]
    gpus: list[GpuSummary]
    events: list[EventView]
    # The CPod's agent cannot isolate jobs: the accounts whose jobs it runs (the provider first).
    # None: it isolates every job.
    unisolated_for: list[str] | None = None
    work: list[WorkView] = field(default_factory=list)  # what runs there now (work.py)

    @property
    def revoked(self) -> bool:
        return self.status == "revoked"

    @property
    def refusals(self) -> list[str]:
        """Why its agent takes no jobs (a failed start-up check), each said once."""
        return list(dict.fromkeys(n.reason for n in self.nodes if n.reason))


def gib(mib: int | None) -> str:
    """MiB as GiB for people: whole numbers without decimals, otherwise one decimal."""
    if mib is None:
        return "—"
    value = mib / MIB_PER_GIB
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def ago(lang: str, seconds: int | None) -> str:
    """ "12 s ago" in the console's language; the same rules as app.js uses while the page is open."""
    if seconds is None:
        return translate(lang, "compute.never")
    seconds = max(seconds, 0)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return translate(lang, f"compute.ago_{unit}").replace("{n}", str(seconds // span))
    return translate(lang, "compute.ago_s").replace("{n}", str(seconds))


def ago_formats(lang: str) -> dict[str, str]:
    """The patterns app.js needs to keep "N s ago" ticking between refreshes."""
    return {unit: translate(lang, f"compute.ago_{unit}") for unit in ("s", "m", "h", "d")} | {
        "never": translate(lang, "compute.never")
    }


def event_name(lang: str, kind: str) -> str:
    """A CPod event's kind in the console's language; a kind this console does not know, as it is."""
    key = f"event.{kind}"
    text = translate(lang, key)
    return kind if text == key else text


def event_detail(lang: str, detail: Reason | None) -> str:
    """A CPod event's detail in the console's language, from its code (web/i18n/reasons.py)."""
    return reason_text(lang, detail) or "—"


def node_view(node: NodeRow) -> NodeView:
    gpu = node.get("gpu")
    return NodeView(
        name=node.get("name", ""),
        status=node.get("status", "not_ready"),
        gpu_product=gpu.get("product") if gpu else None,
        gpu_memory_mib=gpu.get("memory_mib") if gpu else None,
        gpus_total=gpu.get("count", 0) if gpu else 0,
        gpus_allocatable=gpu.get("allocatable", 0) if gpu else 0,
        gpus_used=gpu.get("used", 0) if gpu else 0,
        cpu_cores=node.get("cpu_cores", 0),
        memory_mib=node.get("memory_mib", 0),
        reason=node.get("reason") or None,
    )


def recent_events(
    session: Session, cpod_ids: list[str], limit: int = EVENTS_SHOWN
) -> dict[str, list[EventView]]:
    """The newest ``limit`` events of each CPod, newest first, in one query (the page refreshes every
    few seconds, so not one query per CPod)."""
    if not cpod_ids:
        return {}
    rank = func.row_number().over(partition_by=CPodEvent.cpod_id, order_by=CPodEvent.id.desc()).label("rank")
    ranked = select(CPodEvent.id, rank).where(CPodEvent.cpod_id.in_(cpod_ids)).subquery()
    rows = session.execute(
        select(CPodEvent, User.email)
        .join(ranked, ranked.c.id == CPodEvent.id)
        .outerjoin(User, CPodEvent.actor_id == User.id)
        .where(ranked.c.rank <= limit)
        .order_by(CPodEvent.cpod_id, CPodEvent.id.desc())
    ).all()
    result: dict[str, list[EventView]] = defaultdict(list)
    for event, email in rows:
        result[event.cpod_id].append(EventView(event.at, event.kind, event.detail, email))
    return result


def display_status(cpod: CPod) -> str:
    return "revoked" if cpod.revoked_at is not None else cpod.status.value


def cpod_views(session: Session, user: User, now: datetime) -> list[CPodView]:
    """The CPods ``user`` may see (their own; every one for an admin), oldest first."""
    rows = cpods.list_for(session, user)
    events = recent_events(session, [cpod.id for cpod, _ in rows])
    work = work_on(session, [cpod.id for cpod, _ in rows])
    trusted_ids = {i for cpod, _ in rows for i in cpod.trusted_owner_ids}
    emails = dict(session.execute(select(User.id, User.email).where(User.id.in_(trusted_ids))).all())
    views = []
    for cpod, email in rows:
        last = cpod.last_heartbeat_at
        views.append(
            CPodView(
                id=cpod.id,
                name=cpod.name,
                owner_email=email,
                status=display_status(cpod),
                runtime=cpod.runtime,
                fine_tunes=cpod.takes_fine_tunes,
                cache_entries=len(cpod.cached_inputs or ()),
                cache_size=size(cpods.cached_bytes(cpod)),
                agent_version=cpod.agent_version,
                created_at=cpod.created_at,
                last_heartbeat_at=last,
                heartbeat_age_s=max(int((now - last).total_seconds()), 0) if last else None,
                nodes=[node_view(n) for n in cpod.nodes],
                gpus=summarize(cpod.nodes),
                events=events.get(cpod.id, []),
                unisolated_for=None
                if cpod.isolation == "isolated"
                else [email, *(emails[i] for i in cpod.trusted_owner_ids if i in emails)],
                work=work.get(cpod.id, []),
            )
        )
    return views


def online_totals(views: list[CPodView]) -> list[GpuSummary]:
    """GPUs per product summed over the online CPods among ``views``."""
    return add_up(line for view in views if view.status == CPodStatus.ONLINE.value for line in view.gpus)


def status_counts(views: list[CPodView]) -> dict[str, int]:
    counts = dict.fromkeys(("online", "unknown", "offline", "revoked"), 0)
    for view in views:
        counts[view.status] += 1
    return counts
