"""Pod logs into the attempt's spool file: every pod's log is read with timestamps, so nothing is
shipped twice, and appended prefixed ``[rank N] ``; JobSync ships the spool by offset like the local
runtime's log. The spool's length is saved with the record, so a restart truncates a half-written
tail."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.runtimes.kube_objects import CONTAINER, KubeJob, rank, short

log = logging.getLogger("sxwl.agent.kubernetes")

# Lines of a pod's log fetched again around the last one shipped (clock skew between agent and node).
LOG_SINCE_MARGIN_S = 120


def _ts_key(stamp: str) -> str:
    """An RFC 3339 UTC timestamp with nanoseconds padded to nine digits: strings that sort in time."""
    stamp = stamp.rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    return f"{whole}.{fraction.ljust(9, '0')[:9]}"


def _parse_mark(mark: str) -> float:
    whole = mark.partition(".")[0]
    try:
        return datetime.fromisoformat(whole + "+00:00").timestamp()
    except ValueError:
        return 0.0


def new_log_lines(text: str, mark: str | None, seen_at_mark: int) -> tuple[list[str], str | None, int]:
    """The lines of a ``timestamps=true`` pod log not shipped yet: those after ``mark`` (the newest
    timestamp shipped, normalised by ``_ts_key``), and those at it beyond the ``seen_at_mark`` already
    shipped. Returns them without their timestamps, the new mark and how many lines it has shipped."""
    out: list[str] = []
    skip = seen_at_mark if mark is not None else 0
    count = skip
    for raw in text.splitlines():
        stamp, _, line = raw.partition(" ")
        if not stamp[:1].isdigit():
            continue  # not a timestamped line
        key = _ts_key(stamp)
        if mark is not None and key < mark:
            continue
        if key == mark and skip > 0:
            skip -= 1
            continue
        if key != mark:
            mark, count = key, 0
        count += 1
        out.append(line)
    return out, mark, count


def truncate_spool(spool: Path, job: KubeJob) -> None:
    """Drops a tail written after the record was last saved (its marks do not cover it)."""
    if spool.exists() and spool.stat().st_size > job.spool_size:
        with spool.open("r+b") as handle:
            handle.truncate(job.spool_size)


def ship(job: KubeJob, pod: Any, text: str, spool: Path) -> bool:
    """Appends the lines of ``text`` (a ``timestamps=true`` log, or a part of one in whole lines)
    that the spool does not hold yet, prefixed by the pod's rank; True when any were."""
    name = pod.metadata.name
    mark, seen = job.log_marks.get(name, [None, 0])
    lines, mark, seen = new_log_lines(text, mark, seen)
    if not lines:
        return False
    prefix = f"[rank {rank(pod)}] "
    spool.parent.mkdir(parents=True, exist_ok=True)
    with spool.open("ab") as handle:
        handle.truncate(job.spool_size)
        handle.seek(job.spool_size)
        handle.write("".join(f"{prefix}{line}\n" for line in lines).encode())
        job.spool_size = handle.tell()
    job.log_marks[name] = [mark, seen]
    return True


def since_kwargs(job: KubeJob, pod: Any) -> dict[str, Any]:
    """The log request's arguments: with timestamps, from a margin before the newest line shipped."""
    kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
    mark = job.log_marks.get(pod.metadata.name, [None, 0])[0]
    if mark is not None:
        elapsed = time.time() - _parse_mark(mark)
        kwargs["since_seconds"] = max(1, int(elapsed) + LOG_SINCE_MARGIN_S)
    return kwargs


def started(pod: Any) -> bool:
    """A container of the pod has run, so it has a log."""
    statuses = pod.status.container_statuses or []
    return any(s.state and (s.state.running or s.state.terminated) for s in statuses)


async def collect_logs(core: client.CoreV1Api, job: KubeJob, pods: list[Any], spool: Path) -> bool:
    """Appends what each pod wrote since the last pass to the spool, prefixed by its rank, in rank
    order; True when the record changed and must be saved."""
    changed = False
    for pod in sorted(pods, key=rank):
        if not started(pod):
            continue
        name = pod.metadata.name
        try:
            text = await core.read_namespaced_pod_log(name, pod.metadata.namespace, **since_kwargs(job, pod))
        except ApiException as exc:
            log.debug("no log yet from pod %s: %s", name, short(exc))
            continue
        changed = ship(job, pod, str(text or ""), spool) or changed
    return changed
