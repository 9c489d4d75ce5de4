"""Cores and memory as allocations, on SQLite and PostgreSQL: what a node's live attempts asked for is
taken off what it offers (services/scheduling/capacity.py), whichever replica placed them and whether
or not the agent has reported them yet; the job that does not fit waits with a reason naming what is
held, and gets the node once the attempt holding it ends. A job that asked for no cores or memory
holds none and is held back by none (docs/architecture.md, "Cores and memory")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sxwl.cloud.db.models import JobState
from sxwl.protocol import attempt_key
from tests.conftest import MakeSettings
from tests.support.cpods import A100
from tests.support.scheduling_world import World, node

CPOD = "c" * 32


@pytest.fixture
def world(make_settings: MakeSettings) -> Iterator[World]:
    found = World(make_settings())
    found.add_cpod(CPOD, [node("w1", cores=8, memory_gib=32, gpus=8)])
    yield found
    found.close()


@pytest.fixture
def replica(world: World) -> Iterator[World]:
    found = world.replica()
    yield found
    found.close()


def test_two_environments_that_together_exceed_a_nodes_cores_take_turns(world: World, replica: World) -> None:
    first_env, first = world.create_env("first", cpus=6)
    _, second = world.create_env("second", cpus=6)
    assert world.schedule() == [first]
    waiting = world.job(second)
    assert waiting.state == JobState.QUEUED
    assert waiting.reason == (
        "waiting for CPU cores held by other work to become free (the job needs a CPU-only node with 6 "
        "CPU cores)"
    )
    # Another replica, whose cache read the first placement from the database, does not place it
    # either; nor does the agent's report of the attempt (its cores are held, reported or not).
    assert replica.schedule() == []
    world.report(first, JobState.RUNNING)
    world.set_cpod(CPOD, reported_jobs=[attempt_key(first, 1)])
    assert world.schedule() == [] and replica.schedule() == []

    # Work that asked for no cores holds none and is held back by none: a GPU job still goes there.
    plain = world.submit("plain", gpus_per_node=1, gpu_product=A100["product"])
    assert replica.schedule() == [plain]

    # The first environment's attempt ends (paused): its cores are free for the second.
    world.pause(first_env)
    world.report(first, JobState.CANCELLED)
    assert replica.schedule() == [second]
    assert world.job(second).cpod_id == CPOD and world.job(second).reason is None
    assert world.schedule() == []


def test_memory_is_held_the_same_way_and_both_are_named_when_both_are_short(world: World) -> None:
    big, big_job = world.create_env("big", memory_gib=20)
    _, again = world.create_env("again", memory_gib=20)
    assert world.schedule() == [big_job]
    assert world.job(again).reason == (
        "waiting for memory held by other work to become free (the job needs a CPU-only node with 20 "
        "GiB of memory)"
    )
    _, both = world.create_env("both", cpus=8, memory_gib=16)
    _, cores_only = world.create_env("cores", cpus=4)
    # The cores-only environment fits beside the memory one; then the node has 4 cores and 12 GiB left.
    assert world.schedule() == [cores_only]
    assert world.schedule() == []
    assert world.job(both).reason == (
        "waiting for CPU cores and memory held by other work to become free (the job needs a CPU-only "
        "node with 8 CPU cores with 16 GiB of memory)"
    )
    world.report(big_job, JobState.RUNNING)
    world.pause(big)
    world.report(big_job, JobState.CANCELLED)  # 20 GiB free again: the next in line takes them
    assert world.schedule() == [again]


def test_an_attempt_that_ends_on_its_own_or_is_lost_frees_its_cores(world: World, replica: World) -> None:
    _, first = world.create_env("first", cpus=8)
    _, second = world.create_env("second", cpus=8)
    assert replica.schedule() == [first]
    world.report(first, JobState.RUNNING)
    assert world.schedule() == []
    world.report(first, JobState.LOST)  # requeued: a new attempt, placed again
    assert world.schedule() == [first]  # first in line, it gets its cores back
    world.report(first, JobState.RUNNING)
    world.report(first, JobState.FAILED)  # JupyterLab exited: the environment ended
    assert replica.schedule() == [second]
