"""The fleet's state as gauges, read from the database when /metrics is scraped: a handful of
grouped counts on indexed columns and the node snapshots of online CPods. Whichever worker or
replica answers reports the same figures, so they are never added up across workers."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.json_rows import NodeRow
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import gpu_summary

# Upper bounds (seconds) of the heartbeat-age buckets; each bucket counts the CPods heard from at
# most that long ago, like a histogram's ``le``. CPods never heard from count only in "+Inf".
HEARTBEAT_AGE_BUCKETS = (10.0, 30.0, 60.0, 300.0, 3600.0)


class FleetCollector(Collector):
    def __init__(self, ctx: CloudContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterable[Metric]:
        with self.ctx.db.session() as session:
            now = utcnow()
            cpods = dict(
                session.execute(
                    select(CPod.status, func.count()).where(CPod.revoked_at.is_(None)).group_by(CPod.status)
                ).all()
            )
            heard = (CPod.last_heartbeat_at >= now - timedelta(seconds=s) for s in HEARTBEAT_AGE_BUCKETS)
            ages = session.execute(
                select(*(func.coalesce(func.sum(case((h, 1))), 0) for h in heard), func.count()).where(
                    CPod.revoked_at.is_(None)
                )
            ).one()
            snapshots = session.scalars(
                select(CPod.nodes).where(CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None))
            ).all()
            jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
            oldest = session.scalar(select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED))
        by_status = GaugeMetricFamily("sxwl_cpods", "CPods by status, not revoked", labels=["status"])
        for status in CPodStatus:
            by_status.add_metric([status.value], cpods.get(status, 0))
        yield by_status
        age = GaugeMetricFamily(
            "sxwl_cpod_heartbeat_age_cpods",
            "CPods whose last heartbeat is at most `le` seconds old",
            labels=["le"],
        )
        for bound, count in zip((*(f"{s:g}" for s in HEARTBEAT_AGE_BUCKETS), "+Inf"), ages, strict=True):
            age.add_metric([bound], count)
        yield age
        yield from _gpus(snapshots)
        by_state = GaugeMetricFamily("sxwl_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            by_state.add_metric([state.value], jobs.get(state, 0))
        yield by_state
        queued = jobs.get(JobState.QUEUED, 0)
        yield GaugeMetricFamily("sxwl_queue_depth", "Jobs waiting for GPUs", value=queued)
        yield GaugeMetricFamily(
            "sxwl_queue_oldest_age_seconds",
            "Time since the oldest queued job was submitted (0 when none waits)",
            value=max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0,
        )


def _gpus(snapshots: Iterable[list[NodeRow]]) -> Iterable[Metric]:
    # Per product name: the same product with two memory sizes is one label value.
    totals: dict[str, list[int]] = {}
    for nodes in snapshots:
        for line in gpu_summary.summarize(nodes):
            sums = totals.setdefault(line.product, [0, 0, 0])
            sums[0] += line.total
            sums[1] += line.allocatable
            sums[2] += line.used
    offered = GaugeMetricFamily("sxwl_gpus_offered", "GPUs on online CPods", labels=["product"])
    allocatable = GaugeMetricFamily(
        "sxwl_gpus_allocatable", "GPUs on ready nodes of online CPods", labels=["product"]
    )
    in_use = GaugeMetricFamily("sxwl_gpus_in_use", "GPUs of online CPods in use by jobs", labels=["product"])
    for product, (total, ready, used) in sorted(totals.items()):
        offered.add_metric([product], total)
        allocatable.add_metric([product], ready)
        in_use.add_metric([product], used)
    return (offered, allocatable, in_use)
