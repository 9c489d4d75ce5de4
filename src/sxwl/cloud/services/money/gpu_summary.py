"""GPU totals per product (name and memory): the one type the API's CPods and gpu-types, the
console's compute pages and the submit form's product list all show."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from sxwl.cloud.db.json_rows import NodeRow

Product = tuple[str, int]  # (product, memory_mib)
COUNTS = ("total", "allocatable", "used", "available")


class GpuAvailability(BaseModel):
    """What a compute user may ask for: free and total GPUs of one product, no CPod named."""

    model_config = ConfigDict(frozen=True)

    product: str
    memory_mib: int
    available: int
    total: int
    # What a user pays per GPU-hour of it (micro-yuan); None: no price yet, so it is not offered.
    price_per_hour: int | None = None


class GpuSummary(GpuAvailability):
    """One product's GPUs on a CPod (or several): ``allocatable`` counts ready nodes only, and
    ``available`` is what of that is not in use."""

    allocatable: int
    used: int


def _summaries(sums: dict[Product, dict[str, int]]) -> list[GpuSummary]:
    return [GpuSummary(product=p, memory_mib=m, **counts) for (p, m), counts in sorted(sums.items())]


def summarize(nodes: list[NodeRow]) -> list[GpuSummary]:
    """Totals per GPU product over a CPod's nodes (as their snapshot stores them); not-ready nodes
    have nothing allocatable."""
    sums: dict[Product, dict[str, int]] = {}
    for node in nodes:
        gpu = node.get("gpu")
        if not gpu:
            continue
        entry = sums.setdefault((gpu["product"], gpu["memory_mib"]), dict.fromkeys(COUNTS, 0))
        used = gpu.get("used", 0)
        entry["total"] += gpu["count"]
        entry["used"] += used
        if node.get("status") == "ready":
            entry["allocatable"] += gpu["allocatable"]
            entry["available"] += max(gpu["allocatable"] - used, 0)
    return _summaries(sums)


def add_up(summaries: Iterable[GpuSummary]) -> list[GpuSummary]:
    """Several CPods' summaries as one, per product."""
    sums: dict[Product, dict[str, int]] = {}
    for line in summaries:
        entry = sums.setdefault((line.product, line.memory_mib), dict.fromkeys(COUNTS, 0))
        for name in COUNTS:
            entry[name] += getattr(line, name)
    return _summaries(sums)
