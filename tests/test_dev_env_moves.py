"""A resumed dev environment waiting for the CPod that keeps its workspace, while that CPod stays full
or has gone offline, moves to another CPod once one has room, with the workspace its last run saved
(docs/dev-envs.md, "Resumed elsewhere"; services/scheduling/moves.py, services/devenvs/relocation.py),
on SQLite and PostgreSQL, with two replicas scheduling: moved once, its owner told why, and only when
the saved copy is its latest; a pause that commits first wins over the move."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from sxwl.cloud.db.models import CPodStatus, JobAttempt, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.scheduling import scheduler
from sxwl.protocol.reasons import english
from tests.conftest import MakeSettings
from tests.support.cpods import A100
from tests.support.scheduling_world import World, node

PRODUCT = A100["product"]
FULL = "a" * 32  # keeps the workspace; a job takes its one GPU
ROOMY = "b" * 32  # offline until the test brings it up
GPU = {"gpus": 1, "gpu_product": PRODUCT}


@pytest.fixture
def world(make_settings: MakeSettings) -> Iterator[World]:
    found = World(make_settings())
    found.add_cpod(FULL, [node("w1", cores=8, memory_gib=32, gpus=1)])
    found.add_cpod(ROOMY, [node("w1", cores=8, memory_gib=32, gpus=1)], status=CPodStatus.OFFLINE)
    yield found
    found.close()


@pytest.fixture
def replica(world: World) -> Iterator[World]:
    found = world.replica()
    yield found
    found.close()


def ran_and_paused(world: World, name: str, saved: bool = True) -> tuple[str, str]:
    """An environment that ran on FULL and was paused there, its workspace saved as it ended (or,
    ``saved`` False, too big to save); then a job takes FULL's GPU. Its id, and that job's."""
    env_id, job_id = world.create_env(name, **GPU)
    assert world.schedule() == [job_id]
    world.report(job_id, JobState.RUNNING)
    world.pause(env_id)
    world.report(job_id, JobState.CANCELLED)
    if saved:
        world.save_workspace(job_id, "5" * 64)
    hog = world.submit("hog", gpus_per_node=1, gpu_product=PRODUCT)
    assert world.schedule() == [hog]
    return env_id, hog


def bring_up(world: World, cpod_id: str) -> None:
    world.set_cpod(cpod_id, status=CPodStatus.ONLINE, last_heartbeat_at=utcnow())


def test_a_waiting_environment_moves_once_another_cpod_has_room(world: World, replica: World) -> None:
    env_id, _ = ran_and_paused(world, "kept")
    waited = world.resume(env_id)
    assert world.schedule() == []
    seen = world.job(waited)
    assert (seen.state, seen.pinned_cpod_id) == (JobState.QUEUED, FULL)
    assert seen.reason == f"waiting for 1 × {PRODUCT} to become free"
    # Paused while it waited, and resumed again: its saved copy is still what its last run left.
    world.pause(env_id)
    resumed = world.resume(env_id)
    assert world.schedule() == [] and world.job(resumed).pinned_cpod_id == FULL

    bring_up(world, ROOMY)
    assert replica.schedule() == [resumed]
    assert world.schedule() == []  # the other replica's pass moves nothing again
    moved = world.job(resumed)
    assert (moved.state, moved.cpod_id, moved.pinned_cpod_id) == (JobState.ASSIGNED, ROOMY, None)
    assert moved.inputs == ["workspace"]  # restored there from the artifact store
    assert moved.events[-2:] == ["moved", "assigned"] and moved.events.count("moved") == 1
    assert english(world.env(env_id).reason) == (
        f"moved from CPod {FULL}, which had no room for it, to CPod {ROOMY} with its saved workspace"
    )
    world.report(resumed, JobState.RUNNING)
    assert world.env(env_id).cpod_id == ROOMY


def test_a_waiting_environment_leaves_a_cpod_that_goes_offline(world: World, replica: World) -> None:
    env_id, _ = ran_and_paused(world, "kept")
    waiting = world.resume(env_id)
    assert world.schedule() == []
    world.set_cpod(FULL, status=CPodStatus.OFFLINE)  # its heartbeats stopped, past the grace
    assert replica.schedule() == []  # no CPod has room yet: it waits, pinned
    assert world.job(waiting).pinned_cpod_id == FULL

    bring_up(world, ROOMY)
    assert replica.schedule() == [waiting]
    moved = world.job(waiting)
    assert (moved.cpod_id, moved.pinned_cpod_id, moved.inputs) == (ROOMY, None, ["workspace"])
    assert moved.events.count("moved") == 1
    assert english(world.env(env_id).reason) == (
        f"moved from CPod {FULL}, which went offline, to CPod {ROOMY} with its saved workspace"
    )


def test_an_older_saved_copy_keeps_it_waiting_for_its_cpod(world: World, replica: World) -> None:
    env_id, hog = ran_and_paused(world, "kept")
    # It ran again on FULL (the hog gone for a while), and that run's workspace was not saved.
    world.report(hog, JobState.RUNNING)
    world.report(hog, JobState.SUCCEEDED)
    again = world.resume(env_id)
    assert world.schedule() == [again]
    world.report(again, JobState.RUNNING)
    world.pause(env_id)
    world.report(again, JobState.CANCELLED)
    hog = world.submit("hog again", gpus_per_node=1, gpu_product=PRODUCT)
    assert world.schedule() == [hog]

    bring_up(world, ROOMY)
    waiting = world.resume(env_id)
    assert world.schedule() == [] and replica.schedule() == []
    seen = world.job(waiting)
    assert (seen.state, seen.pinned_cpod_id, seen.inputs) == (JobState.QUEUED, FULL, [])
    assert "moved" not in seen.events


def test_a_pause_that_commits_first_wins_over_the_move(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    env_id, _ = ran_and_paused(world, "kept")
    waiting = world.resume(env_id)
    bring_up(world, ROOMY)
    decide = scheduler._decide

    def pause_after_deciding(*args: Any) -> Any:
        writes = decide(*args)
        assert waiting in writes.moved
        world.pause(env_id)  # its owner, on another connection, before the pass writes
        return writes

    monkeypatch.setattr(scheduler, "_decide", pause_after_deciding)
    assert world.schedule() == []
    seen = world.job(waiting)
    assert (seen.state, seen.pinned_cpod_id, seen.inputs) == (JobState.CANCELLED, FULL, [])
    assert "moved" not in seen.events
    assert english(world.env(env_id).reason) == "paused by u@example.com"
    with world.ctx.db.session() as session:
        assert session.scalar(select(func.count()).where(JobAttempt.job_id == waiting)) == 0
