"""Fine-tunes on the agent's side (docs/agent.md, "Inputs and the cache"): the input cache against
real HTTP servers (the cloud's answer and a presigned store on another origin), inputs placed in an
attempt's work dir and the trainer run instead of the command, and checkpoints uploaded while the
job still runs, through a real cloud and agent."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from sxwl.agent.client import CloudClient, Rejected
from sxwl.agent.inputs import InputCache, InputError, materialise, read_only_tree
from sxwl.agent.runtimes.local import LocalRuntime
from sxwl.agent.runtimes.sandbox import detect
from sxwl.agent.runtimes.sandbox_mounts import JOB_OUTPUT, JOB_WORK
from sxwl.agent.runtimes.trainer_run import TRAINER_RUN_FILE
from sxwl.protocol.finetune import CHECKPOINT_DIR, JobInput, ResolvedHyperparameters, TrainerRun, TrainerSpec
from sxwl.protocol.models import Assignment
from tests.support.agent import eventually
from tests.support.input_server import JOB, Served, input_path, job_input, servers, tar_of
from tests.support.places import private_dir
from tests.support.threads import run_on_thread
from tests.test_jobs_process import World

__all__ = ["private_dir", "servers"]  # the fixtures
T = TypeVar("T")
TOKEN = "sxcp_test-token"


async def fetch(cloud: Served, root: Path, *items: JobInput) -> list[Path]:
    client = CloudClient(cloud.url)
    try:
        cache = InputCache(root, client)
        return list(await asyncio.gather(*(cache.fetch(TOKEN, JOB, 1, item) for item in items)))
    finally:
        await client.close()


def test_an_input_redirected_to_the_store_arrives_without_the_cpod_token(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, store = servers
    data = b'{"messages": []}\n' * 1000
    store.bodies["/bucket/file?sig"] = data
    store.bodies["/bucket/file"] = data
    cloud.redirects[input_path("training_file")] = f"{store.url}/bucket/file?sig=1"
    (cached,) = run_on_thread(fetch(cloud, tmp_path / "cache", job_input("training_file", data)))

    assert cached.read_bytes() == data
    assert cached.name == hashlib.sha256(data).hexdigest()
    assert cached.stat().st_mode & 0o777 == 0o444
    assert cloud.seen == [(input_path("training_file") + "?attempt=1", f"Bearer {TOKEN}")]
    assert store.seen == [("/bucket/file?sig=1", None)]  # the token never reached the store
    cache = InputCache(tmp_path / "cache", CloudClient(cloud.url))
    assert [(e.sha256, e.size) for e in cache.entries()] == [(cached.name, len(data))]


def test_bytes_that_do_not_match_their_sha256_are_refused_and_not_cached(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    cloud.bodies[input_path("training_file")] = b"tampered"
    with pytest.raises(InputError, match="sha256"):
        run_on_thread(fetch(cloud, tmp_path / "cache", job_input("training_file", b"the real bytes")))
    left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert left == []
    assert InputCache(tmp_path / "cache", CloudClient(cloud.url)).entries() == []


def test_an_unknown_input_is_refused(servers: tuple[Served, Served], tmp_path: Path) -> None:
    cloud, _ = servers
    with pytest.raises(Rejected, match="no such input"):
        run_on_thread(fetch(cloud, tmp_path / "cache", job_input("model", b"x")))


@pytest.mark.parametrize(
    ("members", "links"),
    [
        ({"../escape.txt": b"out"}, None),
        ({"/etc/absolute": b"out"}, None),
        ({"config.json": b"{}"}, {"weights.bin": "/etc/passwd"}),
        ({"config.json": b"{}"}, {"inside": "config.json"}),
    ],
    ids=["dotdot", "absolute", "symlink-out", "symlink-in"],
)
def test_an_archive_with_a_member_leaving_it_or_a_link_is_refused(
    servers: tuple[Served, Served], tmp_path: Path, members: dict[str, bytes], links: dict[str, str] | None
) -> None:
    cloud, _ = servers
    data = tar_of(members, links)
    cloud.bodies[input_path("model")] = data
    with pytest.raises(InputError, match="cannot unpack"):
        run_on_thread(fetch(cloud, tmp_path / "cache", job_input("model", data, archive=True)))
    assert not (tmp_path / "escape.txt").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == []
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []


def test_an_archive_is_unpacked_once_read_only_and_concurrent_fetches_download_once(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    data = tar_of({"config.json": b'{"model_type": "gpt2"}', "tokenizer/vocab.json": b"{}"})
    cloud.bodies[input_path("model")] = data
    item = job_input("model", data, archive=True)
    first, second = run_on_thread(fetch(cloud, tmp_path / "cache", item, item))

    assert first == second == tmp_path / "cache" / f"{item.sha256}.d"
    assert len(cloud.seen) == 1  # two attempts needing the same model fetched it once
    assert (first / "config.json").read_bytes() == b'{"model_type": "gpt2"}'
    assert {p.relative_to(first).as_posix(): p.stat().st_mode & 0o777 for p in first.rglob("*")} == {
        "config.json": 0o444,
        "tokenizer": 0o555,
        "tokenizer/vocab.json": 0o444,
    }
    assert first.stat().st_mode & 0o777 == 0o555
    run_on_thread(fetch(cloud, tmp_path / "cache", item))
    assert len(cloud.seen) == 1  # and a later attempt finds it cached

    placed = tmp_path / "work" / "model"
    (tmp_path / "work").mkdir()
    materialise(first, placed)
    assert (placed / "config.json").stat().st_ino == (first / "config.json").stat().st_ino
    assert (placed / "tokenizer").stat().st_mode & 0o777 == 0o555
    assert (placed / "tokenizer" / "vocab.json").stat().st_mode & 0o777 == 0o444


def test_the_resume_checkpoint_stays_the_tar_the_trainer_wrote(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    data = tar_of({"trainer_state.json": b"{}"})
    cloud.bodies[input_path("resume")] = data
    (cached,) = run_on_thread(fetch(cloud, tmp_path / "cache", job_input("resume", data, archive=True)))
    assert cached.is_file() and cached.read_bytes() == data


def fine_tune(inputs: list[JobInput]) -> Assignment:
    spec = TrainerSpec(
        hyperparameters=ResolvedHyperparameters(n_epochs=1, batch_size=1, learning_rate_multiplier=1)
    )
    return Assignment(
        job_id=JOB,
        attempt=1,
        name="ft",
        owner_id="u",
        command=["sxwl-trainer"],
        gpus_per_node=0,
        nodes=1,
        inputs=inputs,
        trainer=spec,
    )


def test_a_fine_tune_runs_the_agents_trainer_on_its_inputs_read_only(private_dir: Path) -> None:
    """The attempt's inputs are hard links in its work dir, which the sandboxed job cannot change;
    the command run is ``python -m sxwl.trainer <run file>`` with every path as the job sees it. The
    state dir is below a dir the job's uid cannot search, with spaces in its path: the trainer still
    reads its run file (docs/agent.md, "Isolation")."""
    cache = private_dir / "state" / "cache"
    cache.mkdir(parents=True)
    # The model as a file, not a tree: the trainer then stops at its first check, before it loads
    # the training libraries (this test needs none of them).
    model = cache / "m"
    model.write_bytes(b"not a model dir")
    data = cache / "t"
    data.write_bytes(b'{"messages": []}\n')
    os.chmod(model, 0o444)
    os.chmod(data, 0o444)
    isolation = detect("auto")
    runtime = LocalRuntime(private_dir / "state", [], isolation=isolation)
    runtime.accepted_owners = None
    assignment = fine_tune([job_input("model", b"m"), job_input("training_file", b"t")])
    job = runtime.start(assignment, {"model": model, "training_file": data})
    eventually(lambda: runtime.poll(), timeout=60, what="the trainer to end")

    work = runtime.workdir(JOB, 1) / "work"
    run_file = TrainerRun.model_validate_json((work / TRAINER_RUN_FILE).read_text())
    # In a sandbox, the attempt's dirs are at fixed paths; without one, where they are.
    seen_work, seen_output = (
        (JOB_WORK, JOB_OUTPUT) if isolation.isolated else (work, runtime.outputs(job).path)
    )
    assert run_file.model_dir == str(seen_work / "inputs" / "model")
    assert run_file.training_file == str(seen_work / "inputs" / "training_file")
    assert run_file.validation_file is None and run_file.resume_from is None
    assert run_file.output_dir == str(seen_output)
    assert (work / "inputs" / "training_file").stat().st_ino == data.stat().st_ino
    log = runtime.log_path(job).read_text()
    # The agent's trainer was run, read its run file, and stopped at a model_dir that is no dir.
    assert f"sxwl-trainer: error: model_dir: {seen_work / 'inputs' / 'model'} not found" in log, log
    assert job.outcome == "failed"
    runtime.done(job)
    assert data.read_bytes() == b'{"messages": []}\n' and model.read_bytes() == b"not a model dir"


def test_a_sandboxed_job_cannot_change_its_inputs(tmp_path: Path) -> None:
    isolation = detect("auto")
    if not isolation.isolated:
        pytest.skip(f"no sandbox here: {isolation.why}")
    cache = tmp_path / "state" / "cache"
    cache.mkdir(parents=True)
    data = cache / "t"
    data.write_bytes(b"original")
    os.chmod(data, 0o444)
    tree = cache / "m.d"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "config.json").write_bytes(b"{}")
    read_only_tree(tree)
    runtime = LocalRuntime(tmp_path / "state", [], isolation=isolation)
    script = (
        'f="$HOME/inputs/training_file"; cat "$f"; echo; '
        '(chmod 0666 "$f" && echo chmod-ok) 2>/dev/null || echo chmod-refused; '
        '(echo changed > "$f") 2>/dev/null && echo write-ok || echo write-refused; '
        '(rm -f "$f") 2>/dev/null; test -e "$f" && echo still-there; '
        '(touch "$HOME/inputs/model/sub/new") 2>/dev/null && echo add-ok || echo add-refused; '
        'cat "$HOME/inputs/model/sub/config.json"; echo'
    )
    assignment = Assignment(
        job_id=JOB,
        attempt=1,
        name="t",
        owner_id="u",
        command=script,
        gpus_per_node=0,
        nodes=1,
        inputs=[job_input("training_file", b"original"), job_input("model", b"m", archive=True)],
    )
    job = runtime.start(assignment, {"training_file": data, "model": tree})
    eventually(lambda: runtime.poll(), timeout=60, what="the job to end")
    log = runtime.log_path(job).read_text()
    assert log.split() == [
        "original",
        "chmod-refused",
        "write-refused",
        "still-there",
        "add-refused",
        "{}",
    ], log
    assert data.read_bytes() == b"original" and data.stat().st_mode & 0o777 == 0o444
    runtime.done(job)
    assert not (runtime.workdir(JOB, 1) / "work").exists()  # its read-only dirs were removed too
    assert data.read_bytes() == b"original" and (tree / "sub" / "config.json").read_bytes() == b"{}"


WRITES_A_CHECKPOINT = (
    f'mkdir -p "$SXWL_OUTPUT_DIR/{CHECKPOINT_DIR}" && cd "$SXWL_OUTPUT_DIR/{CHECKPOINT_DIR}" && '
    "printf 'weights of step one' > .step-00000001.tar.partial && "
    "mv .step-00000001.tar.partial step-00000001.tar && echo written && sleep 300"
)


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def test_a_checkpoint_reaches_the_cloud_while_the_job_runs(world: World) -> None:
    world.agent("a", gpus=1)
    world.online()
    job_id = world.submit(WRITES_A_CHECKPOINT)
    world.wait_state(job_id, "running")
    path = f"{CHECKPOINT_DIR}/step-00000001.tar"

    def listed() -> list[dict[str, Any]] | None:
        artifacts: list[dict[str, Any]] = httpx.get(
            f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user
        ).json()
        return artifacts or None

    (artifact,) = eventually(listed, timeout=30, what="the checkpoint to be uploaded")
    assert world.job(job_id)["state"] == "running"  # before the job ended
    assert artifact["path"] == path
    got = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts/{path}", headers=world.user)
    assert got.content == b"weights of step one"

    cancel = httpx.post(f"{world.url}/api/v1/jobs/{job_id}/cancel", headers=world.user)
    assert cancel.json()["cancel_requested"] is True
    world.wait_state(job_id, "cancelled")
    final = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user).json()
    assert [a["path"] for a in final] == [path]
    assert world.logs(job_id).count("written") == 1


def test_a_capped_cache_removes_the_least_recently_taken_but_never_a_recent_one(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    root = tmp_path / "cache"

    def take(data: bytes) -> Path:
        cloud.bodies[input_path("training_file")] = data

        async def fetch_capped() -> Path:
            client = CloudClient(cloud.url)
            try:
                cache = InputCache(root, client, max_bytes=250)
                return await cache.fetch(TOKEN, JOB, 1, job_input("training_file", data))
            finally:
                await client.close()

        return run_on_thread(fetch_capped())

    blobs = [bytes([65 + n]) * 100 for n in range(4)]
    a, b = take(blobs[0]), take(blobs[1])
    an_hour_ago = time.time() - 3600
    os.utime(a, (an_hour_ago - 60, an_hour_ago - 60))
    os.utime(b, (an_hour_ago, an_hour_ago))
    c = take(blobs[2])  # 300 bytes would be over the cap: the least recently taken goes
    assert (a.exists(), b.exists(), c.exists()) == (False, True, True)
    assert take(blobs[1]) == b  # taken again from the cache: recent now
    d = take(blobs[3])  # over the cap again, but every entry left was taken just now: all stay
    assert b.exists() and c.exists() and d.exists()
    listed = InputCache(root, CloudClient(cloud.url)).entries()
    assert sorted(e.sha256 for e in listed) == sorted(p.name for p in (b, c, d))
