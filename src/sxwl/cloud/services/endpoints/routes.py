"""Where a call to an endpoint may go, as plain data (routing.py decides it; call_cache.py keeps it
for a moment)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    endpoint_id: str
    name: str
    cpod_id: str
    target: str


@dataclass(frozen=True)
class Replica:
    """A replica that serves now: where its engine is, and the key its CPod reports its load by."""

    cpod_id: str
    target: str
    attempt_key: str


@dataclass(frozen=True)
class Serving:
    """An endpoint's replicas that serve now (at least one)."""

    endpoint_id: str
    name: str
    replicas: tuple[Replica, ...]
