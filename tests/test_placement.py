"""Placement and queue order, without a database."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sxwl.cloud.services.scheduling.placement import (
    CPodCapacity,
    Need,
    NodeCapacity,
    Placement,
    Pool,
    why_not,
)
from sxwl.cloud.services.scheduling.scheduler import fair_order
from sxwl.protocol.reasons import english

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def pod(cpod_id: str, *nodes: tuple[str, str | None, int, int]) -> CPodCapacity:
    return CPodCapacity(cpod_id, [NodeCapacity(n, p, a, f) for n, p, a, f in nodes])


def place(need: Need, cpods: list[CPodCapacity]) -> Placement | None:
    return Pool(cpods).place(need)


def test_single_node_best_fit_prefers_the_tightest_node() -> None:
    pool = [pod("c1", ("big", A100, 8, 8), ("half", A100, 8, 3)), pod("c2", ("tight", A100, 8, 2))]
    assert place(Need(A100, 2, 1), pool).node_names == ["tight"]  # type: ignore[union-attr]
    assert place(Need(A100, 3, 1), pool).node_names == ["half"]  # type: ignore[union-attr]
    assert place(Need(A100, 8, 1), pool).node_names == ["big"]  # type: ignore[union-attr]
    assert place(Need(A100, 9, 1), pool) is None


def test_product_must_match_and_any_product_when_unset() -> None:
    pool = [pod("c1", ("h", H100, 8, 8))]
    assert place(Need(A100, 1, 1), pool) is None
    assert place(Need(None, 1, 1), pool) is not None
    assert place(Need(H100, 1, 1), pool).cpod_id == "c1"  # type: ignore[union-attr]


def test_multi_node_needs_distinct_nodes_of_one_cpod() -> None:
    pool = [
        pod("c1", ("a", A100, 8, 8), ("b", A100, 8, 8)),
        pod("c2", ("x", A100, 8, 8), ("y", A100, 8, 8), ("z", A100, 8, 4)),
    ]
    placed = place(Need(A100, 8, 3), pool)
    assert placed is None  # c2 has three nodes but only two with 8 free; c1 has only two nodes
    placed = place(Need(A100, 4, 3), pool)
    assert placed is not None and placed.cpod_id == "c2" and sorted(placed.node_names) == ["x", "y", "z"]
    two = place(Need(A100, 8, 2), pool)
    assert two is not None and len(set(two.node_names)) == 2


def test_take_reduces_free_capacity() -> None:
    pool = Pool([pod("c1", ("a", A100, 8, 8)), pod("c2", ("b", A100, 8, 7))])
    placed = pool.place(Need(A100, 8, 1))
    assert placed == Placement("c1", ["a"])
    pool.take(placed, 6)
    assert pool.place(Need(A100, 3, 1)) == Placement("c2", ["b"])
    assert pool.place(Need(A100, 2, 1)) == Placement("c1", ["a"])  # now the tightest
    assert pool.place(Need(A100, 2, 1, cpod_id="c1")) == Placement("c1", ["a"])
    pool.take(Placement("c1", ["a"]), 2)
    assert pool.place(Need(A100, 1, 1, cpod_id="c1")) is None
    assert pool.place(Need(None, 0, 1)) == Placement("c1", ["a"])  # a CPU-only job still fits


def test_pinned_cpod_and_not_ready_nodes() -> None:
    pool = [pod("c1", ("a", A100, 8, 8)), pod("c2", ("b", A100, 8, 8))]
    assert place(Need(A100, 1, 1, cpod_id="c2"), pool).cpod_id == "c2"  # type: ignore[union-attr]
    pool[0].nodes[0].ready = False
    assert place(Need(A100, 1, 1, cpod_id="c1"), pool) is None
    assert place(Need(None, 0, 1, cpod_id="c1"), pool) is None  # CPU jobs need a ready node too


def test_reasons_say_what_to_do() -> None:
    pool = [pod("c1", ("a", A100, 8, 0))]
    assert english(why_not(Need(A100, 2, 1), pool, None)) == f"waiting for 2 × {A100} to become free"
    assert english(why_not(Need(H100, 2, 1), pool, None)) == f"no online CPod offers 2 × {H100}"
    assert (
        english(why_not(Need(A100, 2, 3), pool, None))
        == f"no online CPod offers 3 nodes with 2 × {A100} each"
    )
    assert english(why_not(Need(A100, 1, 1, cpod_id="c9"), pool, False)) == "CPod c9 is not online"


def reference_place(need: Need, cpods: list[CPodCapacity]) -> Placement | None:
    """The definition of best fit, by brute force over every node: what the index must agree with."""
    best: tuple[int, str, list[str]] | None = None
    for cpod in cpods:
        if need.cpod_id is not None and cpod.id != need.cpod_id:
            continue
        fitting = sorted(
            (n.free, n.name)
            for n in cpod.nodes
            if n.ready
            and (
                need.gpus_per_node == 0
                or (need.gpu_product in (None, n.product) and n.free >= need.gpus_per_node)
            )
        )
        if len(fitting) >= need.nodes:
            chosen = fitting[: need.nodes]
            key = (sum(free - need.gpus_per_node for free, _ in chosen), cpod.id, [n for _, n in chosen])
            if best is None or key[:2] < best[:2]:
                best = key
    return Placement(best[1], best[2]) if best else None


def test_index_agrees_with_brute_force_while_capacity_is_taken() -> None:
    rng = random.Random(7)
    for _ in range(30):
        cpods = [
            CPodCapacity(
                f"c{c}",
                [
                    NodeCapacity(
                        f"n{k}", rng.choice([A100, H100, None]), 8, rng.randint(0, 8), rng.random() > 0.1
                    )
                    for k in range(rng.randint(1, 5))
                ],
            )
            for c in range(rng.randint(1, 12))
        ]
        pool = Pool(copy.deepcopy(cpods))
        for _ in range(60):
            need = Need(
                rng.choice([A100, H100, None]),
                rng.choice([0, 1, 2, 4, 8]),
                rng.choice([1, 1, 1, 2, 3]),
                rng.choice([None, None, None, f"c{rng.randint(0, 12)}"]),
            )
            placed = pool.place(need)
            assert placed == reference_place(need, cpods), need
            if placed is not None:
                pool.take(placed, need.gpus_per_node)
                for node in next(c for c in cpods if c.id == placed.cpod_id).nodes:
                    if node.name in placed.node_names:
                        node.free -= need.gpus_per_node


@dataclass
class FakeJob:
    id: str
    owner_id: str
    priority: int
    created_at: datetime


def test_fair_share_interleaves_users_and_keeps_priority_first() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    greedy = [FakeJob(f"g{i}", "greedy", 0, t0 + timedelta(seconds=i)) for i in range(1000)]
    modest = [FakeJob("m0", "modest", 0, t0 + timedelta(seconds=5000))]
    urgent = [FakeJob("u0", "admin", 5, t0 + timedelta(seconds=9000))]
    queue: list[Any] = [*greedy, *modest, *urgent]
    order = [j.id for j in fair_order(queue, {"greedy": 16})]
    assert order[0] == "u0"
    # The modest user's only job comes before most of the greedy user's queue: it goes first,
    # since the greedy user already holds GPUs.
    assert order.index("m0") == 1
    assert order[2:5] == ["g0", "g1", "g2"]


def test_a_dev_environment_goes_only_to_a_cpod_that_runs_them_and_says_why_it_waits() -> None:
    kube = pod("k", ("n", A100, 8, 8))
    local = CPodCapacity(
        "l",
        [NodeCapacity("vm", A100, 1, 1)],
        runtime="local",
        takes_fine_tunes=True,
        takes_endpoints=True,
        takes_dev_envs=True,
    )
    need = Need(A100, 1, 1, dev_env=True)
    assert place(need, [kube]) is None
    assert "run no dev environments" in str(english(why_not(need, [kube], None)))
    assert place(need, [kube, local]).cpod_id == "l"  # type: ignore[union-attr]
    assert place(Need(A100, 1, 1), [kube]) is not None  # other jobs still go there
    # A Kubernetes CPod whose agent has a dev environment image runs them; a local one that says
    # it does not, does not.
    kube.takes_dev_envs = True
    assert place(need, [kube]).cpod_id == "k"  # type: ignore[union-attr]
    local.takes_dev_envs = False
    assert place(need, [local]) is None


def test_an_endpoint_replica_goes_only_where_an_engine_runs_and_says_why_it_waits() -> None:
    """A Kubernetes CPod whose agent has no engine image would fail a replica at once; one with it,
    and a local CPod, take replicas."""
    kube = pod("k", ("n", A100, 8, 8))
    local = CPodCapacity(
        "l",
        [NodeCapacity("vm", A100, 1, 1)],
        runtime="local",
        takes_fine_tunes=True,
        takes_endpoints=True,
        takes_dev_envs=True,
    )
    need = Need(A100, 1, 1, engine=True)
    assert place(need, [kube]) is None
    assert "do not run inference engines" in str(english(why_not(need, [kube], None)))
    assert place(need, [kube, local]).cpod_id == "l"  # type: ignore[union-attr]
    serving = CPodCapacity("s", [NodeCapacity("n", A100, 8, 8)], takes_fine_tunes=True, takes_endpoints=True)
    assert place(need, [serving]).cpod_id == "s"  # type: ignore[union-attr]


def test_cores_and_memory_per_node_decide_where_a_need_fits_and_why_it_waits() -> None:
    def node(name: str, cores: int, memory_gib: int) -> NodeCapacity:
        return NodeCapacity(name, A100, 8, 8, cpu_cores=cores, memory_mib=memory_gib * 1024)

    pool = [CPodCapacity("c1", [node("small", 8, 32)]), CPodCapacity("c2", [node("big", 64, 512)])]
    assert place(Need(None, 0, 1, cpus=8, memory_mib=32 * 1024), pool) == Placement("c1", ["small"])
    assert place(Need(None, 0, 1, cpus=9), pool) == Placement("c2", ["big"])
    assert place(Need(A100, 1, 1, memory_mib=64 * 1024), pool) == Placement("c2", ["big"])
    assert place(Need(None, 0, 1, cpus=65), pool) is None
    assert place(Need(None, 0, 1, cpus=9, cpod_id="c1"), pool) is None
    assert english(why_not(Need(None, 0, 1, cpus=65), pool, None)) == (
        "no online CPod offers a CPU-only node with 65 CPU cores"
    )
    too_much = Need(A100, 2, 1, cpus=4, memory_mib=1024 * 1024)
    assert english(why_not(too_much, pool, None)) == (
        f"no online CPod offers 2 × {A100} with 4 CPU cores with 1024 GiB of memory"
    )


def test_cores_and_memory_held_on_a_node_are_not_handed_out_again_and_the_reason_names_them() -> None:
    def node(name: str, gpus_free: int, cores_held: int, memory_held_gib: int) -> NodeCapacity:
        return NodeCapacity(
            name,
            A100,
            8,
            gpus_free,
            cpu_cores=16,
            memory_mib=64 * 1024,
            cores_held=cores_held,
            memory_held_mib=memory_held_gib * 1024,
        )

    pool = Pool([CPodCapacity("c1", [node("a", 8, 12, 0), node("b", 0, 0, 60)])])
    need = Need(A100, 1, 1, cpus=8, memory_mib=8 * 1024)
    # Node a has the GPUs but only 4 cores left, b the cores but no GPU and 4 GiB left: each part is
    # free somewhere, none on one node; every part some node lacks is named.
    assert pool.place(need) is None
    assert english(why_not(need, pool.cpods.values(), None)) == (
        f"waiting for GPUs and CPU cores and memory held by other work to become free (the job needs 1 × "
        f"{A100} with 8 CPU cores with 8 GiB of memory)"
    )
    whole = Need(None, 0, 1, cpus=16)
    assert pool.place(whole) == Placement("c1", ["b"])  # a has 4 cores left: only b has 16
    pool.take(Placement("c1", ["b"]), 0, cpus=16)
    assert pool.place(whole) is None
    four = Need(None, 0, 1, cpus=4)
    assert pool.place(four) == Placement("c1", ["a"])
    pool.take(Placement("c1", ["a"]), 0, cpus=4)
    assert pool.place(four) is None
    assert english(why_not(four, pool.cpods.values(), None)) == (
        "waiting for CPU cores held by other work to become free (the job needs a CPU-only node with 4 "
        "CPU cores)"
    )
    assert pool.place(Need(None, 0, 1, cpus=17)) is None  # more than any node has: never
    assert english(why_not(Need(None, 0, 1, cpus=17), pool.cpods.values(), None)) == (
        "no online CPod offers a CPU-only node with 17 CPU cores"
    )
    # A job that asked for neither is held back by neither.
    assert pool.place(Need(A100, 8, 1)) == Placement("c1", ["a"])
