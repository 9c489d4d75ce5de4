"""Where a job fits: pure code over free capacity, so it can be tested without a database.

A job with inputs prefers, among the placements that fit, a CPod that already holds most of their
bytes (docs/finetune-locality.md); fitting always comes first, and which job is placed next is the
scheduler's fair order, never this module's."""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from sxwl.protocol.reasons import Reason


@dataclass
class NodeCapacity:
    name: str
    product: str | None  # None: a node without GPUs
    allocatable: int  # GPUs the node offers at all
    free: int  # GPUs free right now
    ready: bool = True
    # What the node reports having: a job that asks for more cores or memory per node never fits it.
    cpu_cores: int = 0
    memory_mib: int = 0
    # What the live attempts placed on it asked for (the agent reports no cores or memory in use):
    # a job fits only in what is left.
    cores_held: int = 0
    memory_held_mib: int = 0


@dataclass
class CPodCapacity:
    id: str
    nodes: list[NodeCapacity] = field(default_factory=list)
    runtime: str = "kubernetes"  # "local": jobs are processes, a container image cannot be run
    # Its agent fetches inputs and runs the trainer: the local runtime, a Kubernetes one with a
    # trainer image.
    takes_fine_tunes: bool = False
    # Its agent runs endpoint replicas' engines and dev environments' JupyterLab: the local runtime,
    # a Kubernetes one with an engine image, a dev environment image.
    takes_endpoints: bool = False
    takes_dev_envs: bool = False
    # The owners whose jobs it may run (a CPod without isolation); None: anyone's.
    takes_only: frozenset[str] | None = None
    cached: frozenset[str] = frozenset()  # the sha256 of the inputs its agent keeps fetched

    def refuses(self, need: Need) -> str | None:
        """Why this CPod can never take ``need``'s job, whatever is free."""
        if need.image and self.runtime == "local":
            return "image"
        if need.fine_tune and not self.takes_fine_tunes:
            return "fine-tune"
        if need.dev_env and not self.takes_dev_envs:
            return "dev-env"  # a Kubernetes agent without a dev environment image (docs/dev-envs.md)
        if need.engine and not self.takes_endpoints:
            return "endpoint"  # its agent has no engine image (docs/endpoints.md)
        if self.takes_only is not None and need.owner_id not in self.takes_only:
            return "isolation"
        return None


@dataclass(frozen=True)
class Need:
    gpu_product: str | None
    gpus_per_node: int
    nodes: int
    cpod_id: str | None = None
    image: bool = False  # the job names a container image
    # Set when some CPod takes only some owners' jobs; otherwise left out, so that jobs of the same
    # shape from different owners share one answer within a pass.
    owner_id: str | None = None
    # What the job fetches onto its CPod, (sha256, size) once per content, sorted so that jobs with
    # the same inputs share one answer within a pass; and whether it runs the fine-tune trainer.
    inputs: tuple[tuple[str, int], ...] = ()
    trainer: bool = False
    dev_env: bool = False  # a dev environment's job: its agent runs JupyterLab
    engine: bool = False  # an endpoint replica's job: its agent runs an inference engine
    cpus: int | None = None  # cores per node it asked for (a dev environment's); None: any node
    memory_mib: int | None = None  # memory per node it asked for; None: any node

    @property
    def fine_tune(self) -> bool:
        """Whether only a CPod that takes fine-tunes can run it: it runs the trainer, or fetches
        inputs for none of the kinds whose CPods fetch their own (a dev environment's models, files
        and saved workspace; a replica's model: docs/agent.md)."""
        return self.trainer or (bool(self.inputs) and not (self.dev_env or self.engine))

    def describe(self) -> Reason:
        if not self.gpus_per_node:
            each = Reason.of("need.cpu")
        elif self.gpu_product is None:
            each = Reason.of("need.gpus_any", gpus=self.gpus_per_node)
        else:
            each = Reason.of("need.gpus", gpus=self.gpus_per_node, product=self.gpu_product)
        if self.cpus:
            each = Reason.of("need.cores", each=each, cpus=self.cpus)
        if self.memory_mib:
            each = Reason.of("need.memory", each=each, memory_gib=self.memory_mib // 1024)
        return Reason.of("need.nodes", nodes=self.nodes, each=each) if self.nodes > 1 else each


@dataclass(frozen=True)
class Placement:
    cpod_id: str
    node_names: list[str]


# A ready node in the index: ordered by free GPUs, then CPod and node, which is best-fit order.
Entry = tuple[int, str, str]


def _fits(node: NodeCapacity, need: Need, free: bool) -> bool:
    """Whether ``node`` has room for ``need`` now (``free``) or would have once nothing else ran."""
    if not node.ready or not _cores_fit(node, need, free) or not _memory_fits(node, need, free):
        return False
    return _gpus_fit(node, need, free)


def _gpus_fit(node: NodeCapacity, need: Need, free: bool) -> bool:
    if need.gpus_per_node == 0:
        return True
    if need.gpu_product is not None and node.product != need.gpu_product:
        return False
    return (node.free if free else node.allocatable) >= need.gpus_per_node


def _cores_fit(node: NodeCapacity, need: Need, free: bool) -> bool:
    return not need.cpus or node.cpu_cores - (node.cores_held if free else 0) >= need.cpus


def _memory_fits(node: NodeCapacity, need: Need, free: bool) -> bool:
    return not need.memory_mib or node.memory_mib - (node.memory_held_mib if free else 0) >= need.memory_mib


class Pool:
    """Free capacity during one scheduling pass. Per GPU product it keeps the ready nodes sorted by
    (free, CPod, node), so the tightest fitting node is one bisect away and taking GPUs is a delete
    and an insort, instead of a scan of every node for every job."""

    def __init__(self, cpods: Iterable[CPodCapacity] = ()) -> None:
        self.cpods = {c.id: c for c in cpods}
        self._index: dict[str | None, list[Entry]] = {}
        self._holders: dict[str, set[str]] = {}  # sha256 -> the CPods that keep it cached
        for cpod in self.cpods.values():
            self._hold(cpod)
            for node in cpod.nodes:
                if node.ready:
                    self._index.setdefault(node.product, []).append((node.free, cpod.id, node.name))
        for entries in self._index.values():
            entries.sort()
        self.touched: set[str] = set()  # CPods that ``take`` changed

    @property
    def restricted(self) -> bool:
        """Some CPod takes only some owners' jobs: a need must then name its owner."""
        return any(c.takes_only is not None for c in self.cpods.values())

    def put(self, cpod: CPodCapacity) -> None:
        """Adds a CPod, or replaces what the pool knew of it."""
        self.remove(cpod.id)
        self.cpods[cpod.id] = cpod
        self._hold(cpod)
        for node in cpod.nodes:
            if node.ready:
                insort(self._index.setdefault(node.product, []), (node.free, cpod.id, node.name))

    def remove(self, cpod_id: str) -> None:
        cpod = self.cpods.pop(cpod_id, None)
        for sha256 in cpod.cached if cpod else ():
            holders = self._holders[sha256]
            holders.discard(cpod_id)
            if not holders:
                del self._holders[sha256]
        for node in cpod.nodes if cpod else ():
            if node.ready:
                self._drop(node, cpod_id)

    def _hold(self, cpod: CPodCapacity) -> None:
        for sha256 in cpod.cached:
            self._holders.setdefault(sha256, set()).add(cpod.id)

    def _drop(self, node: NodeCapacity, cpod_id: str) -> None:
        entries = self._index[node.product]
        del entries[bisect_left(entries, (node.free, cpod_id, node.name))]

    def place(self, need: Need, products: frozenset[str] | None = None) -> Placement | None:
        """Best fit: among the CPods (or the pinned one) with enough fitting nodes, the choice that
        leaves the fewest GPUs stranded on the chosen nodes, so big jobs still find whole nodes later;
        ties go to the lowest CPod id and node names. ``products``: the GPU products a GPU job may
        get (those with a price); None: any. A job with inputs goes to the fitting CPod that holds
        the most bytes of them, if any holds some; best fit decides among equal holders."""
        if need.cpod_id is not None:
            cpod = self.cpods.get(need.cpod_id)
            if cpod is None or cpod.refuses(need):
                return None
            entries: Iterable[Entry] = self._fitting_on([cpod.id], need, products)
        else:
            refused = {c.id for c in self.cpods.values() if c.refuses(need)}
            if need.inputs and (near := self._near_data(need, products, refused)) is not None:
                return near
            entries = self._fitting(need, products)
            if refused:
                entries = (entry for entry in entries if entry[1] not in refused)
            if need.cpus or need.memory_mib:  # the index orders by free GPUs only
                entries = (entry for entry in entries if self._room_left(entry, need))
        return _best(entries, need)

    def _room_left(self, entry: Entry, need: Need) -> bool:
        """Whether the node of an index entry has the cores and memory ``need`` asks for left."""
        node = next(n for n in self.cpods[entry[1]].nodes if n.name == entry[2])
        return _fits(node, need, free=True)

    def product_of(self, placement: Placement) -> str | None:
        """The GPU product of a placement's nodes (one product per placement: nodes fit by it)."""
        names = set(placement.node_names)
        return next((n.product for n in self.cpods[placement.cpod_id].nodes if n.name in names), None)

    def _fitting_on(
        self, cpod_ids: Iterable[str], need: Need, products: frozenset[str] | None
    ) -> list[Entry]:
        """The fitting nodes of these CPods, in best-fit order (a scan: meant for a few CPods)."""
        return sorted(
            (n.free, cpod_id, n.name)
            for cpod_id in cpod_ids
            for n in self.cpods[cpod_id].nodes
            if _fits(n, need, free=True) and _allowed(n.product, need, products)
        )

    def _near_data(self, need: Need, products: frozenset[str] | None, refused: set[str]) -> Placement | None:
        """The best fit among the CPods holding the most bytes of ``need``'s inputs that still fit
        it, trying fewer bytes held when none of those fits; None when no holder fits at all. Only
        the holders are looked at, through the index by sha256, never every CPod."""
        held: dict[str, int] = {}
        for sha256, size in need.inputs:
            for cpod_id in self._holders.get(sha256, ()):
                if size and cpod_id not in refused:
                    held[cpod_id] = held.get(cpod_id, 0) + size
        by_bytes: dict[int, list[str]] = {}
        for cpod_id, total in held.items():
            by_bytes.setdefault(total, []).append(cpod_id)
        for total in sorted(by_bytes, reverse=True):
            placement = _best(self._fitting_on(by_bytes[total], need, products), need)
            if placement is not None:
                return placement
        return None

    def _fitting(self, need: Need, products: frozenset[str] | None) -> Iterator[Entry]:
        """The index entries that fit ``need``, in best-fit order."""
        if need.gpu_product is not None and need.gpus_per_node:
            lists = [self._index.get(need.gpu_product, [])]
        elif need.gpus_per_node and products is not None:
            lists = [entries for product, entries in self._index.items() if product in products]
        else:  # any product will do (and a CPU-only job takes any ready node)
            lists = list(self._index.values())
        start = (need.gpus_per_node,)  # sorts before every entry with that many free GPUs
        tails = [islice(entries, bisect_left(entries, start), None) for entries in lists]
        if not tails:
            return iter(())
        return tails[0] if len(tails) == 1 else heapq.merge(*tails)

    def take(
        self, placement: Placement, gpus_per_node: int, cpus: int | None = None, memory_mib: int | None = None
    ) -> None:
        """Takes what a placed job asked for off its nodes, for the rest of the pass."""
        cpod = self.cpods[placement.cpod_id]
        self.touched.add(cpod.id)
        for node in cpod.nodes:
            if node.name in placement.node_names:
                self._drop(node, cpod.id)
                node.free -= gpus_per_node
                node.cores_held += cpus or 0
                node.memory_held_mib += memory_mib or 0
                insort(self._index[node.product], (node.free, cpod.id, node.name))


def _allowed(product: str | None, need: Need, products: frozenset[str] | None) -> bool:
    return not need.gpus_per_node or products is None or product in products


def _best(entries: Iterable[Entry], need: Need) -> Placement | None:
    """The best choice among fitting ``entries`` given in best-fit order: each CPod's first
    ``need.nodes`` entries are its tightest nodes; the CPod whose choice strands the fewest GPUs wins."""
    if need.nodes == 1:
        first = next(iter(entries), None)
        return Placement(first[1], [first[2]]) if first else None
    chosen: dict[str, list[Entry]] = {}
    best: tuple[int, str] | None = None
    for entry in entries:
        picked = chosen.setdefault(entry[1], [])
        if len(picked) == need.nodes:
            continue
        picked.append(entry)
        if len(picked) == need.nodes:
            key = (sum(free - need.gpus_per_node for free, _, _ in picked), entry[1])
            if best is None or key < best:
                best = key
    return Placement(best[1], [name for _, _, name in chosen[best[1]]]) if best else None


def never_fits(need: Need, cpods: Iterable[CPodCapacity], pinned_online: bool | None) -> Reason | None:
    """Why no online CPod could ever run a job of this shape, however long it waits (a price or a
    free GPU would not help), or None."""
    if need.cpod_id is not None and not pinned_online:
        return Reason.of("queue.pinned_offline", cpod=need.cpod_id)
    pool = [c for c in cpods if need.cpod_id is None or c.id == need.cpod_id]
    if any(sum(1 for n in c.nodes if _fits(n, need, free=False)) >= need.nodes for c in pool):
        return None
    if need.gpus_per_node and pool and not any(n.ready and n.allocatable for c in pool for n in c.nodes):
        return Reason.of("queue.no_gpus", need=need.describe())
    return Reason.of("queue.never_fits", need=need.describe())


def why_not(need: Need, cpods: Iterable[CPodCapacity], pinned_online: bool | None) -> Reason:
    """The reason a queued job waits, in words a user can act on."""
    cpods = list(cpods)
    if never := never_fits(need, cpods, pinned_online):
        return never
    pool = [c for c in cpods if need.cpod_id is None or c.id == need.cpod_id]
    big_enough = [c for c in pool if sum(1 for n in c.nodes if _fits(n, need, free=False)) >= need.nodes]
    refusals = {c.refuses(need) for c in big_enough}
    if None in refusals:
        return _busy(need, [c for c in big_enough if c.refuses(need) is None])
    if "image" in refusals:
        return Reason.of("queue.image", need=need.describe())
    if "fine-tune" in refusals:
        code = "queue.no_trainer" if "isolation" not in refusals else "queue.no_trainer_restricted"
        return Reason.of(code, need=need.describe())
    if "dev-env" in refusals:
        return Reason.of("queue.no_dev_env", need=need.describe())
    if "endpoint" in refusals:
        return Reason.of("queue.no_endpoint", need=need.describe())
    return Reason.of("queue.restricted", need=need.describe())


# The parts of a need that other work can hold, each with its check of one node.
_PARTS = (("held.gpus", _gpus_fit), ("held.cores", _cores_fit), ("held.memory", _memory_fits))


def _busy(need: Need, takers: list[CPodCapacity]) -> Reason:
    """Why a job waits that CPods could take once their nodes were empty: for a job that asked for
    cores or memory, which of them (and of its GPUs) other work holds now."""
    if not (need.cpus or need.memory_mib):
        return Reason.of("queue.busy", need=need.describe())
    asked = [(code, fits) for code, fits in _PARTS if code != "held.gpus" or need.gpus_per_node]

    def left(cpod: CPodCapacity, fits: Callable[[NodeCapacity, Need, bool], bool]) -> int:
        """How many of the CPod's nodes that could take the job have this part free now."""
        return sum(1 for n in cpod.nodes if _fits(n, need, free=False) and fits(n, need, True))

    held = [code for code, fits in asked if all(left(c, fits) < need.nodes for c in takers)]
    if not held:  # each part is left somewhere, but not together: name every part some node lacks
        could = {c.id: left(c, lambda *_: True) for c in takers}
        held = [code for code, fits in asked if any(left(c, fits) < could[c.id] for c in takers)]
    if held in ([], ["held.gpus"]):  # a GPU job held back by GPUs (or by a price: see the scheduler)
        return Reason.of("queue.busy", need=need.describe())
    what = Reason.of(held[0])
    for code in held[1:]:
        what = Reason.of("held.and", first=what, then=Reason.of(code))
    return Reason.of("queue.busy_held", what=what, need=need.describe())
