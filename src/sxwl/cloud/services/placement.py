"""Where a job fits: pure functions over free capacity, so they can be tested without a database."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodeCapacity:
    name: str
    product: str | None  # None: a node without GPUs
    allocatable: int  # GPUs the node offers at all
    free: int  # GPUs free right now
    ready: bool = True


@dataclass
class CPodCapacity:
    id: str
    nodes: list[NodeCapacity] = field(default_factory=list)


@dataclass(frozen=True)
class Need:
    gpu_product: str | None
    gpus_per_node: int
    nodes: int
    cpod_id: str | None = None

    def describe(self) -> str:
        gpus = (
            f"{self.gpus_per_node} × {self.gpu_product or 'GPU'}" if self.gpus_per_node else "a CPU-only node"
        )
        return f"{self.nodes} nodes with {gpus} each" if self.nodes > 1 else gpus


@dataclass(frozen=True)
class Placement:
    cpod_id: str
    node_names: list[str]


def _fits(node: NodeCapacity, need: Need, free: bool) -> bool:
    if not node.ready:
        return False
    if need.gpus_per_node == 0:
        return True
    if need.gpu_product is not None and node.product != need.gpu_product:
        return False
    return (node.free if free else node.allocatable) >= need.gpus_per_node


def place(need: Need, cpods: list[CPodCapacity]) -> Placement | None:
    """Best fit: among the CPods (or the pinned one) with enough fitting nodes, the choice that leaves
    the fewest GPUs stranded on the chosen nodes, so big jobs still find whole nodes later."""
    if need.nodes == 1:
        return _place_one(need, cpods)
    best: tuple[int, str, list[str]] | None = None
    for cpod in cpods:
        if need.cpod_id is not None and cpod.id != need.cpod_id:
            continue
        candidates = sorted(
            (n for n in cpod.nodes if _fits(n, need, free=True)), key=lambda n: (n.free, n.name)
        )
        if len(candidates) < need.nodes:
            continue
        chosen = candidates[: need.nodes]
        leftover = sum(n.free - need.gpus_per_node for n in chosen)
        key = (leftover, cpod.id, [n.name for n in chosen])
        if best is None or key[:2] < best[:2]:
            best = key
    return Placement(best[1], best[2]) if best else None


def _place_one(need: Need, cpods: list[CPodCapacity]) -> Placement | None:
    """The single-node case in one pass over the nodes, no sorting: it is most jobs, and a pass
    places thousands of them over thousands of nodes."""
    best: tuple[int, str, str] | None = None
    for cpod in cpods:
        if need.cpod_id is not None and cpod.id != need.cpod_id:
            continue
        for node in cpod.nodes:
            if _fits(node, need, free=True):
                key = (node.free - need.gpus_per_node, cpod.id, node.name)
                if best is None or key < best:
                    best = key
    return Placement(best[1], [best[2]]) if best else None


def take(cpods: list[CPodCapacity], placement: Placement, gpus_per_node: int) -> None:
    for cpod in cpods:
        if cpod.id == placement.cpod_id:
            for node in cpod.nodes:
                if node.name in placement.node_names:
                    node.free -= gpus_per_node


def why_not(need: Need, cpods: list[CPodCapacity], pinned_online: bool | None) -> str:
    """The reason a queued job waits, in words a user can act on."""
    if need.cpod_id is not None and not pinned_online:
        return f"CPod {need.cpod_id} is not online"
    pool = [c for c in cpods if need.cpod_id is None or c.id == need.cpod_id]
    could_ever = any(sum(1 for n in c.nodes if _fits(n, need, free=False)) >= need.nodes for c in pool)
    if not could_ever:
        return f"no online CPod offers {need.describe()}"
    return f"waiting for {need.describe()} to become free"
