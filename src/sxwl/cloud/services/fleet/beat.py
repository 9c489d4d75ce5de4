"""One heartbeat as the group commit carries it, checked and encoded on the event loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from sxwl.cloud.db.types import EncodedJSON
from sxwl.protocol import Heartbeat, Node, attempt_key
from sxwl.protocol.endpoints import EngineLoad
from sxwl.protocol.finetune import CachedInput

NODES = TypeAdapter(list[Node])
CACHE = TypeAdapter(list[CachedInput])


@dataclass(frozen=True)
class Beat:
    """One heartbeat, checked and encoded on the event loop, waiting to be written."""

    token: str
    seq: int
    nodes: EncodedJSON
    node_count: int
    reported_jobs: list[str]
    claimed_cpod_id: str | None = None
    # The inputs the CPod holds, encoded; None: this beat did not report them (kept as stored).
    cache: EncodedJSON | None = None
    # The endpoint replicas' engine loads, by attempt key (services/fleet/engine_loads.py).
    loads: Mapping[str, EngineLoad] = field(default_factory=dict)

    @classmethod
    def of(cls, token: str, hb: Heartbeat) -> Beat:
        return cls(
            token=token,
            seq=hb.seq,
            nodes=EncodedJSON(NODES.dump_json(hb.nodes, exclude_none=True).decode()),
            node_count=len(hb.nodes),
            reported_jobs=[attempt_key(j.job_id, j.attempt) for j in hb.jobs],
            claimed_cpod_id=hb.cpod_id,
            cache=None if hb.cache is None else EncodedJSON(CACHE.dump_json(hb.cache).decode()),
            loads={attempt_key(j.job_id, j.attempt): j.load for j in hb.jobs if j.load is not None},
        )
