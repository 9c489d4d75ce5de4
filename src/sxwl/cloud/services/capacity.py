"""Free GPUs per node of every online CPod: what the CPod last reported, minus the assignments it has
not reported yet (invariant 3, docs/architecture.md), kept in memory between scheduling passes.

Re-reading every CPod's node snapshot and every active job's placement made up most of a small
pass. The cache holds only facts that never change under their key: a CPod's nodes, reported
jobs and cached inputs for one heartbeat version (``last_seq``, ``last_heartbeat_at``), and the
placement of one job attempt. Each pass, under the scheduler lock, checks the keys against the
database (the CPods' versions and the active job attempts, small columns only) and reads the rows
behind new keys. What another replica or process assigned, finished or requeued is therefore
seen by the next pass as exactly as a full re-read would see it; freshness does not rest on
wake-ups or timers.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import ACTIVE_STATES, CPod, CPodStatus, Job
from sxwl.cloud.services.placement import CPodCapacity, NodeCapacity, Pool

# Bound parameters per IN list: well under every engine's limit.
_CHUNK = 1000
# Everything is read again now and then anyway, in case a writer changes a CPod's nodes without
# moving its heartbeat version; the check above keeps correctness, this only bounds surprises.
FULL_REREAD_S = 30.0

AttemptKey = tuple[str, int]  # (job id, attempt)


@dataclass(frozen=True)
class Hold:
    """An active job attempt's GPUs on its CPod."""

    cpod_id: str
    node_names: tuple[str, ...]
    gpus_per_node: int
    owner_id: str

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.node_names)


# A CPod's heartbeat version, and what its agent said at its start (runtime, isolation, trusted).
Version = tuple[int, datetime | None, str, str, tuple[str, ...]]


@dataclass(frozen=True)
class _Snapshot:
    version: Version
    nodes: list[dict[str, Any]]
    reported: frozenset[str]  # "<job_id>:<attempt>" the agent said it holds
    cached: frozenset[str]  # the sha256 of the inputs the CPod keeps fetched

    @property
    def takes_only(self) -> frozenset[str] | None:
        _, _, _, isolation, trusted = self.version
        return None if isolation == "isolated" else frozenset(trusted)


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
        self._read_all_at = float("-inf")

    def refresh(self, session: Session) -> Pool:
        """The free capacity as the database has it now, for one pass to place jobs on. What the
        pass takes from it is worked out again from the database at the next refresh."""
        if time.monotonic() - self._read_all_at > FULL_REREAD_S:
            for table in (self._snapshots, self._holds, self._by_cpod, self._usage):
                table.clear()
            self.pool = Pool()
            self._read_all_at = time.monotonic()
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
        versions: dict[str, Version] = {
            cpod_id: (seq, at, runtime, isolation, (owner_id, *trusted))
            for cpod_id, seq, at, runtime, isolation, owner_id, trusted in connection.execute(
                select(
                    CPod.id,
                    CPod.last_seq,
                    CPod.last_heartbeat_at,
                    CPod.runtime,
                    CPod.isolation,
                    CPod.owner_id,
                    CPod.trusted_owner_ids,
                ).where(CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None))
            )
        }
        for cpod_id in self._snapshots.keys() - versions.keys():  # went offline or was revoked
            del self._snapshots[cpod_id]
            self._dirty.add(cpod_id)
        changed = [
            c for c, v in versions.items() if c not in self._snapshots or self._snapshots[c].version != v
        ]
        for chunk in _chunks(changed):
            for cpod_id, nodes, reported, cached in connection.execute(
                select(CPod.id, CPod.nodes, CPod.reported_jobs, CPod.cached_inputs).where(CPod.id.in_(chunk))
            ):
                # The version read above: a heartbeat in between is seen (and re-read) next pass.
                # Only a heartbeat changes the cache, so it too never changes under the version.
                self._snapshots[cpod_id] = _Snapshot(
                    versions[cpod_id],
                    nodes,
                    frozenset(reported),
                    frozenset(entry["sha256"] for entry in cached or ()),
                )
                self._dirty.add(cpod_id)

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
                    Job.id, Job.attempt, Job.cpod_id, Job.node_names, Job.gpus_per_node, Job.owner_id
                ).where(Job.id.in_(chunk))
            )
            for job_id, attempt, cpod_id, node_names, gpus_per_node, owner_id in rows:
                if (job_id, attempt) in new and cpod_id is not None:
                    self.hold((job_id, attempt), Hold(cpod_id, tuple(node_names), gpus_per_node, owner_id))

    def _compute(self, cpod_id: str) -> CPodCapacity:
        snapshot = self._snapshots[cpod_id]
        unreported: dict[str, int] = defaultdict(int)
        for job_id, attempt in self._by_cpod.get(cpod_id, ()):
            if f"{job_id}:{attempt}" not in snapshot.reported:
                hold = self._holds[(job_id, attempt)]
                for name in hold.node_names:
                    unreported[name] += hold.gpus_per_node
        entry = CPodCapacity(
            cpod_id, runtime=snapshot.version[2], takes_only=snapshot.takes_only, cached=snapshot.cached
        )
        for node in snapshot.nodes:
            gpu = node.get("gpu") or {}
            allocatable = int(gpu.get("allocatable", 0))
            free = allocatable - int(gpu.get("used", 0)) - unreported[node["name"]]
            entry.nodes.append(
                NodeCapacity(
                    node["name"], gpu.get("product"), allocatable, max(free, 0), node.get("status") == "ready"
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
