"""How the agent's job sync starts an attempt with inputs (docs/agent.md, "Inputs and the cache"):
reported ``starting`` at once, its inputs fetched in a task of its own, then started with them; a
fetch that cannot succeed fails the attempt naming the input; a stop while fetching ends the fetch
and starts nothing; a restart in the middle reports the attempt lost. Against a real agent
``JobSync``, ``InputCache`` and ``LocalRuntime`` and a stand-in for the cloud's agent routes on
loopback (tests/support/input_server.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sxwl.agent.client import CloudClient
from sxwl.agent.inputs import InputCache
from sxwl.agent.jobsync import JobSync
from sxwl.agent.runtimes.local import LocalJob, LocalRuntime
from sxwl.protocol import AssignmentsReply
from sxwl.protocol.models import Assignment, Command
from tests.support.agent import eventually
from tests.support.input_server import JOB, Served, input_path, job_input, servers
from tests.support.threads import run_on_thread

__all__ = ["servers"]  # the fixture
T = TypeVar("T")
TOKEN = "sxcp_test-token"
DATA = b'{"messages": [{"role": "user", "content": "hi"}]}\n'


def with_sync(cloud: Served, state: Path, body: Callable[[JobSync[LocalJob]], Awaitable[T]]) -> T:
    """Runs ``body`` with a job sync of a local runtime under ``state``, on a loop in a thread."""

    async def main() -> T:
        client = CloudClient(cloud.url)
        runtime = LocalRuntime(state, [])
        runtime.accepted_owners = None  # this test's own jobs, unisolated
        sync = JobSync(client, runtime, TOKEN, InputCache(state / "cache", client))
        sync.fetch_retry_s = (0.05, 0.05)
        try:
            return await body(sync)
        finally:
            for task in list(sync.preparing.values()):
                task.cancel()
            await client.close()

    return run_on_thread(main())


def assignment(command: str = 'cat "$HOME/inputs/training_file"') -> Assignment:
    return Assignment(
        job_id=JOB,
        attempt=1,
        name="t",
        owner_id="u",
        command=command,
        gpus_per_node=0,
        nodes=1,
        inputs=[job_input("training_file", DATA)],
    )


async def until(check: Callable[[], bool]) -> None:
    for _ in range(600):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def test_an_attempt_starts_once_its_inputs_are_fetched(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    cloud.bodies[input_path("training_file")] = DATA

    async def body(sync: JobSync[LocalJob]) -> str:
        await sync.handle(AssignmentsReply(assignments=[assignment()]))
        assert sync.reports() == []  # while its inputs are fetched: its GPUs stay counted as assigned
        assert f"{JOB}:1" in sync.preparing
        await until(lambda: bool(sync.runtime.jobs))
        (job,) = sync.runtime.jobs.values()
        await until(lambda: bool(sync.runtime.poll()))
        report = sync.cache_report()
        assert report is not None and [e.size for e in report] == [len(DATA)]
        sync.cache_reported(report)
        assert sync.cache_report() is None  # unchanged since the last accepted beat
        return sync.runtime.log_path(job).read_text()

    log = with_sync(cloud, tmp_path / "state", body)
    assert log == DATA.decode()
    assert cloud.reports[0] == {"attempt": 1, "state": "starting"}
    assert not list((tmp_path / "state" / "cache" / ".pending").iterdir())


def test_an_input_that_cannot_be_fetched_fails_the_attempt_naming_it(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers  # the cloud answers 404 for the training file

    async def body(sync: JobSync[LocalJob]) -> bool:
        await sync.handle(AssignmentsReply(assignments=[assignment()]))
        await until(lambda: not sync.preparing)
        return sync.runtime.knows(JOB, 1)

    assert with_sync(cloud, tmp_path / "state", body) is False  # never started
    starting, failed = cloud.reports
    assert starting["state"] == "starting"
    assert failed["state"] == "failed"
    assert failed["reason"].startswith("could not fetch input training_file: no such input")
    fetches = [path for path, _ in cloud.seen if "/inputs/" in path]
    assert len(fetches) == 3  # tried again before giving up


def test_a_stop_while_fetching_ends_the_fetch_and_starts_nothing(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    cloud.bodies[input_path("training_file")] = DATA
    held = cloud.held[input_path("training_file")] = threading.Event()

    async def body(sync: JobSync[LocalJob]) -> bool:
        await sync.handle(AssignmentsReply(assignments=[assignment()]))
        await until(lambda: any("/inputs/" in path for path, _ in cloud.seen))
        stop = Command(id=7, kind="stop", job_id=JOB, attempt=1, cancel=True, reason="cancelled by its user")
        await sync.handle(AssignmentsReply(commands=[stop]))
        held.set()
        await asyncio.sleep(0.3)
        return sync.runtime.knows(JOB, 1) or bool(sync.preparing)

    assert with_sync(cloud, tmp_path / "state", body) is False
    assert [(r["state"], r.get("reason")) for r in cloud.reports] == [
        ("starting", None),
        ("cancelled", "cancelled by its user"),
    ]
    cache = tmp_path / "state" / "cache"
    assert [p for p in cache.iterdir() if not p.name.startswith(".")] == []  # nothing half-fetched kept
    assert list((cache / ".tmp").iterdir()) == []


def test_an_attempt_left_fetching_by_a_restart_is_reported_lost(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    InputCache(tmp_path / "state" / "cache", CloudClient(cloud.url)).mark_pending(JOB, 3)

    async def body(sync: JobSync[LocalJob]) -> None:
        await sync.report_left_pending()

    with_sync(cloud, tmp_path / "state", body)
    assert cloud.reports == [
        {
            "attempt": 3,
            "state": "lost",
            "reason": "the agent restarted while fetching the job's inputs",
            "reason_code": "agent.restarted_fetching",
            "reason_params": {},
        }
    ]
    eventually(lambda: not list((tmp_path / "state" / "cache" / ".pending").iterdir()), what="marker gone")


def test_a_kubernetes_cpod_without_trainer_images_refuses_a_fine_tune(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    """A Kubernetes agent started without --trainer-image and --uploader-image runs no fine-tunes:
    it ends such an attempt failed saying which flags it lacks, before fetching anything or calling
    its API server."""
    from kubernetes_asyncio.client import ApiClient, Configuration

    from sxwl.agent.runtimes.kubernetes import KubernetesRuntime

    cloud, _ = servers
    cloud.bodies[input_path("training_file")] = DATA

    async def main() -> None:
        configuration = Configuration()
        configuration.host = "https://127.0.0.1:1"  # never called
        async with ApiClient(configuration) as api:
            client = CloudClient(cloud.url)
            sync = JobSync(client, KubernetesRuntime(api, state_dir=tmp_path / "k8s"), TOKEN)
            with_image = assignment().model_copy(update={"image": "python:3.11"})
            await sync.handle(AssignmentsReply(assignments=[with_image]))
            await client.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    thread.join()
    assert cloud.reports == [
        {
            "attempt": 1,
            "state": "failed",
            "reason": (
                "could not start: this CPod runs no fine-tunes: its agent needs --trainer-image"
                " and --uploader-image"
            ),
            "reason_code": "agent.could_not_start",
            "reason_params": {},
            # The refusal's own code: the console words it in each language.
            "reason_parts": {"error": '{"code":"kube.no_fine_tunes","params":{}}'},
        }
    ]
    assert not any("/inputs/" in path for path, _ in cloud.seen)
