"""What the JSON columns hold, typed: each is read as plain dicts (no model is built on the
scheduler's hot path), and these say which keys those dicts have. They mirror the wire models the
rows are written from (protocol.models.Node, protocol.finetune.JobInput), as dumped with
``exclude_none``: a key of an optional field may be absent."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from sxwl.protocol.finetune import JobInput


class GpuDeviceRow(TypedDict):
    index: int
    uuid: NotRequired[str]
    utilization_pct: NotRequired[int]
    memory_used_mib: NotRequired[int]
    temperature_c: NotRequired[int]


class GpuRow(TypedDict):
    """protocol.models.GpuInfo as a CPod's snapshot stores it."""

    vendor: str
    product: str
    memory_mib: int
    count: int
    allocatable: int
    used: NotRequired[int]
    driver: NotRequired[str]
    cuda: NotRequired[str]
    devices: NotRequired[list[GpuDeviceRow]]


class NodeRow(TypedDict):
    """protocol.models.Node as ``CPod.nodes`` stores it."""

    name: str
    status: str
    cpu_cores: int
    memory_mib: int
    gpu: NotRequired[GpuRow]
    reason: NotRequired[str]


class StoredAt(TypedDict):
    """Where the artifact store keeps an input: ``storage.Artifact``'s fields."""

    job_id: str
    attempt: int
    path: str


class StoredInput(TypedDict):
    """protocol.finetune.JobInput with where the store keeps it, as ``Job.inputs`` lists them."""

    name: str
    sha256: str
    size: int
    archive: bool
    object: StoredAt


def stored_input(entry: JobInput, at: StoredAt) -> StoredInput:
    return StoredInput(
        name=entry.name, sha256=entry.sha256, size=entry.size, archive=entry.archive, object=at
    )


class CachedRow(TypedDict):
    """One input an agent reported holding in its cache (``CPod.cached_inputs``)."""

    sha256: str
    size: int
