"""The engines' load as the heartbeats bring it (docs/endpoints.md, "Load"): per endpoint replica's
attempt, the requests its engine runs and those waiting, as its CPod's last heartbeat to this
process said. Kept in memory, per process: a snapshot that the next heartbeat replaces, worth no
write to the database on the hottest path; with several replicas each shows what the heartbeats it
took said, with their time (docs/replica-state.md)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sxwl.protocol.endpoints import EngineLoad


@dataclass(frozen=True)
class SeenLoad:
    load: EngineLoad
    at: datetime  # when the heartbeat that said it was applied


class EngineLoads:
    """The last load each CPod reported for each of its attempts; an attempt its CPod's next beat
    does not report is forgotten, so what is kept is bounded by what the CPods run now."""

    def __init__(self) -> None:
        self._by_cpod: dict[str, dict[str, SeenLoad]] = {}
        self._lock = threading.Lock()  # written by the heartbeats' writer thread, read by requests

    def record(self, cpod_id: str, loads: Mapping[str, EngineLoad], at: datetime) -> None:
        """``loads``: by attempt key, everything the CPod's accepted beat said."""
        seen = {key: SeenLoad(load, at) for key, load in loads.items()}
        with self._lock:
            if seen:
                self._by_cpod[cpod_id] = seen
            else:
                self._by_cpod.pop(cpod_id, None)

    def of(self, cpod_id: str | None, key: str) -> SeenLoad | None:
        """The load of attempt ``key`` as the CPod that runs it said (another CPod's word is not
        taken: a CPod reads and writes only itself, invariant 2, docs/architecture.md)."""
        if cpod_id is None:
            return None
        with self._lock:
            return self._by_cpod.get(cpod_id, {}).get(key)
