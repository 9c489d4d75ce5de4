"""Free GPUs per node of every online CPod: what the CPod last reported, minus the assignments it has
not reported yet (invariant 3, docs/architecture.md), kept in memory between scheduling passes; and
the cores and memory its live attempts asked for, which the CPod does not report as used, so every
live attempt's are held, reported or not.

Re-reading every CPod's node snapshot and every active job's placement made up most of a small
pass, and even comparing every online CPod's version with the cache took 165 ms of a pass at 10,000
CPods. The cache holds a CPod's facts as of its last write, and the placement of one job attempt
(which never changes under its key). Each pass, under the scheduler lock, reads the CPods that
writes marked since its last read (services/scheduling/capacity_marks.py: triggers mark them, whoever writes)
and checks the active job attempts against the database (a small column each). What another
replica or process assigned, finished, requeued or reported is therefore seen by the next pass
exactly as a full re-read would see it; freshness does not rest on wake-ups or timers.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import ACTIVE_STATES, CPod, CPodStatus, Job
from sxwl.cloud.services.scheduling.capacity_marks import Watermark, watermark
from sxwl.cloud.services.scheduling.placement import CPodCapacity, NodeCapacity, Pool
from sxwl.protocol import attempt_key

# Bound parameters per IN list: well under every engine's limit.
_CHUNK = 1000
_ONLINE = (CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None))

AttemptKey = tuple[str, int]  # (job id, attempt)


@dataclass(frozen=True)
class Hold:
    """An active job attempt's GPUs on its CPod, and the cores and memory per node it asked for (0:
    none asked; a job's default bounds are limits, not reservations: docs/architecture.md)."""

    cpod_id: str
    node_names: tuple[str, ...]
    gpus_per_node: int
    owner_id: str
    cpus: int = 0
    memory_mib: int = 0

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.node_names)


@dataclass(frozen=True)
class _Snapshot:
    runtime: str
    takes_fine_tunes: bool
    takes_endpoints: bool
    takes_dev_envs: bool
    takes_only: frozenset[str] | None  # the owners whose jobs it may run (CPod.takes_only)
    nodes: list[dict[str, Any]]
    reported: frozenset[str]  # "<job_id>:<attempt>" the agent said it holds
    cached: frozenset[str]  # the sha256 of the inputs the CPod keeps fetched


class CapacityCache:
    """One per cloud process and database. ``lock`` is held for a whole pass, so the threads of one
    process never interleave their passes even where no cross-process lock applies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._snapshots: dict[str, _Snapshot] = {}
        self._holds: dict[AttemptKey, Hold] = {}
        self._by_cpod: dict[str, set[AttemptKey]] = defaultdict(set)
        self._usage: dict[str, int] = defaultdict(int)
        self._dirty: set[str] = set()  # CPods whose free GPUs must be worked out again
        self.pool = Pool()
        self._read_up_to: Watermark | None = None  # None: nothing read yet

    def refresh(self, session: Session) -> Pool:
        """The free capacity as the database has it now, for one pass to place jobs on. What the
        pass takes from it is worked out again from the database at the next refresh."""
        connection = session.connection()  # Core rows: these reads are most of a small pass
        self._refresh_cpods(connection)
        self._refresh_holds(connection)
        self._dirty |= self.pool.touched
        self.pool.touched.clear()
        for cpod_id in self._dirty:
            if cpod_id in self._snapshots:
                self.pool.put(self._compute(cpod_id))
            else:
                self.pool.remove(cpod_id)
        self._dirty.clear()
        return self.pool

    def usage(self) -> dict[str, int]:
        """GPUs held by active jobs, per owner: the fair-share and limit figures."""
        return {owner: gpus for owner, gpus in self._usage.items() if gpus}

    def hold(self, key: AttemptKey, hold: Hold) -> None:
        """Records an assignment this process has committed, sparing the next pass a read of it."""
        if key not in self._holds:
            self._holds[key] = hold
            self._by_cpod[hold.cpod_id].add(key)
            self._usage[hold.owner_id] += hold.gpus
            self._dirty.add(hold.cpod_id)

    def _release(self, key: AttemptKey) -> None:
        hold = self._holds.pop(key)
        self._by_cpod[hold.cpod_id].discard(key)
        self._usage[hold.owner_id] -= hold.gpus
        self._dirty.add(hold.cpod_id)

    def _refresh_cpods(self, connection: Connection) -> None:
        start = watermark(connection)
        query = select(
            CPod.id,
            CPod.status,
            CPod.revoked_at,
            CPod.runtime,
            CPod.takes_fine_tunes,
            CPod.takes_endpoints,
            CPod.takes_dev_envs,
            CPod.isolation,
            CPod.owner_id,
            CPod.trusted_owner_ids,
            CPod.nodes,
            CPod.reported_jobs,
            CPod.cached_inputs,
        )
        since = self._read_up_to
        query = query.where(*_ONLINE) if since is None else query.where(since.unread())
        for row in connection.execute(query):
            self._dirty.add(row.id)
            if row.status != CPodStatus.ONLINE or row.revoked_at is not None:  # offline, revoked
                self._snapshots.pop(row.id, None)
                continue
            self._snapshots[row.id] = _Snapshot(
                row.runtime,
                row.takes_fine_tunes,
                row.takes_endpoints,
                row.takes_dev_envs,
                None if row.isolation == "isolated" else frozenset((row.owner_id, *row.trusted_owner_ids)),
                row.nodes,
                frozenset(row.reported_jobs),
                frozenset(entry["sha256"] for entry in row.cached_inputs or ()),
            )
        self._read_up_to = start
        # No write marks a deleted row: a count that differs means one went, so read everything.
        online = connection.scalar(select(func.count()).select_from(CPod).where(*_ONLINE))
        if since is not None and online != len(self._snapshots):
            self._dirty |= self._snapshots.keys()
            self._snapshots.clear()
            self._read_up_to = None
            self._refresh_cpods(connection)

    def _refresh_holds(self, connection: Connection) -> None:
        active = {
            (job_id, attempt)
            for job_id, attempt in connection.execute(
                select(Job.id, Job.attempt).where(Job.state.in_(ACTIVE_STATES))
            ).all()
        }
        for key in self._holds.keys() - active:  # finished, lost or requeued since
            self._release(key)
        new = active - self._holds.keys()
        for chunk in _chunks(sorted({job_id for job_id, _ in new})):
            rows = connection.execute(
                select(
                    Job.id,
                    Job.attempt,
                    Job.cpod_id,
                    Job.node_names,
                    Job.gpus_per_node,
                    Job.owner_id,
                    Job.cpus,
                    Job.memory_mib,
                ).where(Job.id.in_(chunk))
            )
            for job_id, attempt, cpod_id, node_names, gpus, owner_id, cpus, memory_mib in rows:
                if (job_id, attempt) in new and cpod_id is not None:
                    hold = Hold(cpod_id, tuple(node_names), gpus, owner_id, cpus or 0, memory_mib or 0)
                    self.hold((job_id, attempt), hold)

    def _compute(self, cpod_id: str) -> CPodCapacity:
        snapshot = self._snapshots[cpod_id]
        unreported: dict[str, int] = defaultdict(int)
        cores: dict[str, int] = defaultdict(int)
        memory: dict[str, int] = defaultdict(int)
        for job_id, attempt in self._by_cpod.get(cpod_id, ()):
            hold = self._holds[(job_id, attempt)]
            reported = attempt_key(job_id, attempt) in snapshot.reported
            for name in hold.node_names:
                unreported[name] += 0 if reported else hold.gpus_per_node
                cores[name] += hold.cpus
                memory[name] += hold.memory_mib
        entry = CPodCapacity(
            cpod_id,
            runtime=snapshot.runtime,
            takes_fine_tunes=snapshot.takes_fine_tunes,
            takes_endpoints=snapshot.takes_endpoints,
            takes_dev_envs=snapshot.takes_dev_envs,
            takes_only=snapshot.takes_only,
            cached=snapshot.cached,
        )
        for node in snapshot.nodes:
            gpu = node.get("gpu") or {}
            allocatable = int(gpu.get("allocatable", 0))
            free = allocatable - int(gpu.get("used", 0)) - unreported[node["name"]]
            entry.nodes.append(
                NodeCapacity(
                    node["name"],
                    gpu.get("product"),
                    allocatable,
                    max(free, 0),
                    node.get("status") == "ready",
                    cpu_cores=int(node.get("cpu_cores", 0)),
                    memory_mib=int(node.get("memory_mib", 0)),
                    cores_held=cores[node["name"]],
                    memory_held_mib=memory[node["name"]],
                )
            )
        return entry


def _chunks(items: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == _CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch
