"""A job attempt's log is capped and kept out of the database rows (docs/jobs.en.md, "Logs"): past
``log_max_bytes`` what comes is dropped after one line that says so, while the agent's offsets keep
working; the older part of a long log moves to the artifact store in segments and is read back
whole (SQLite and PostgreSQL, the local store)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.app import create_app
from sxwl.cloud.db.models import AttemptLog, LogChunk
from sxwl.cloud.services.jobs.job_logs import drop_line
from sxwl.protocol.finetune import Progress, progress_line
from tests.conftest import MakeSettings
from tests.support.seaweedfs import BUCKET, SeaweedFS
from tests.support.served import Served
from tests.test_cli import sxwl
from tests.test_cpods_api import ctx_of
from tests.test_fine_tunes_api import FineTunes
from tests.test_jobs_api import Setup
from tests.test_s3_artifacts import s3_settings

CAP = 2000
SEGMENT = 1024  # the smallest segment the settings take


def running_job(setup: Setup) -> str:
    job = setup.submit()
    setup.assigned(job["id"])
    assert setup.status(job["id"], 1, "running").status_code == 200
    job_id: str = job["id"]
    return job_id


def stored(client: TestClient, job_id: str) -> tuple[int, int]:
    """The rows and bytes of the job's log that the database holds."""
    with ctx_of(client).db.session() as session:
        rows, size = session.execute(
            select(func.count(), func.coalesce(func.sum(func.length(LogChunk.data)), 0)).where(
                LogChunk.job_id == job_id
            )
        ).one()
    return int(rows), int(size)


def archived(client: TestClient, job_id: str) -> int:
    """The bytes of the job's first attempt's log that the store holds."""
    with ctx_of(client).db.session() as session:
        state = session.get(AttemptLog, (job_id, 1))
        return state.archived if state else 0


def read_whole(client: TestClient, headers: dict[str, str], job_id: str) -> bytes:
    """The log as a reader gets it, one answer at a time from each X-Next-Offset."""
    out, offset = bytearray(), 0
    for _ in range(1000):
        answer = client.get(f"/api/v1/jobs/{job_id}/logs", headers=headers, params={"offset": offset})
        assert answer.status_code == 200, answer.text
        out += answer.content
        offset = int(answer.headers["X-Next-Offset"])
        if answer.headers["X-Log-Complete"] == "true":
            return bytes(out)
    raise AssertionError("the log never said it was complete")


def send(setup: Setup, job_id: str, data: bytes, chunk: int, start: int = 0) -> int:
    """Appends ``data`` from ``start`` as the agent does; returns the offset the cloud answered last."""
    offset = start
    for at in range(0, len(data), chunk):
        reply = setup.log(job_id, 1, offset, data[at : at + chunk])
        assert reply.status_code == 200, reply.text
        offset = reply.json()["next_offset"]
    return offset


@pytest.fixture
def capped(make_client: Callable[..., TestClient]) -> Setup:
    return Setup(make_client(log_max_bytes=CAP, log_segment_bytes=SEGMENT))


def test_a_log_over_its_cap_keeps_its_first_bytes_and_one_line_and_still_takes_offsets(capped: Setup) -> None:
    job_id = running_job(capped)
    output = b"".join(f"step {i:05} of a chatty job\n".encode() for i in range(400))  # 11,200 bytes
    assert send(capped, job_id, output, chunk=700) == len(output)  # every offset acknowledged
    kept = output[:CAP] + drop_line(CAP, after_newline=output[CAP - 1 : CAP] == b"\n")
    assert b"reached its limit of 2000 bytes" in kept
    rows, size = stored(capped.client, job_id)
    assert size + archived(capped.client, job_id) == len(kept)

    # More output, a retried chunk and a gap, all past the cap: the offsets still work as before,
    # and nothing more is stored.
    more = b"and then some more\n" * 50
    assert send(capped, job_id, more, chunk=300, start=len(output)) == len(output) + len(more)
    again = capped.log(job_id, 1, len(output), more[:300])
    assert again.status_code == 200 and again.json()["next_offset"] == len(output) + len(more)
    gap = capped.log(job_id, 1, len(output) + len(more) + 5, b"lost?")
    assert gap.status_code == 409 and gap.json()["error"]["details"]["next_offset"] == len(output) + len(more)
    assert stored(capped.client, job_id) == (rows, size)
    assert size + archived(capped.client, job_id) == len(kept)

    assert capped.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    assert read_whole(capped.client, capped.user, job_id) == kept
    assert kept.endswith(b"the rest of its output is dropped\n")
    assert kept.count(b"[sxwl]") == 1


def test_a_long_log_moves_to_the_store_and_reads_back_whole(make_client: Callable[..., TestClient]) -> None:
    client = make_client(log_segment_bytes=SEGMENT, log_read_max_bytes=700)
    setup = Setup(client)
    job_id = running_job(setup)
    output = b"".join(f"epoch {i // 100} batch {i:05} loss {1 / (i + 1):.6f}\n".encode() for i in range(700))
    assert len(output) > 20 * SEGMENT
    assert send(setup, job_id, output, chunk=900) == len(output)

    # The database holds under two segments and one append of it; the rest is in the store.
    size = stored(client, job_id)[1]
    assert size < 2 * SEGMENT + 900
    with ctx_of(client).db.session() as session:
        state = session.get(AttemptLog, (job_id, 1))
        assert state is not None and state.archived == len(output) - size and state.archived % SEGMENT == 0
    segments = Path(ctx_of(client).settings.data_dir) / "artifacts" / "logs" / job_id / "1"
    files = sorted(segments.iterdir(), key=lambda p: int(p.name))
    assert [int(p.name) for p in files] == list(range(state.archived // SEGMENT))
    assert b"".join(p.read_bytes() for p in files) == output[: state.archived]

    # Read while it runs (from the store, across a segment's edge, then from the rows), and after.
    middle = client.get(f"/api/v1/jobs/{job_id}/logs", headers=setup.user, params={"offset": SEGMENT - 10})
    assert middle.content == output[SEGMENT - 10 : SEGMENT]  # up to the segment's end
    assert middle.headers["X-Next-Offset"] == str(SEGMENT) and middle.headers["X-Log-Complete"] == "false"
    assert setup.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    assert read_whole(client, setup.user, job_id) == output


def test_with_the_s3_store_a_long_logs_older_part_is_read_back_from_the_bucket(
    make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    settings = s3_settings(
        make_settings, seaweed, tmp_path, log_segment_bytes=SEGMENT, log_read_max_bytes=700
    )
    output = b"".join(f"step {i:05} loss {1 / (i + 1):.6f}\n".encode() for i in range(1000))
    with TestClient(create_app(settings)) as client:
        setup = Setup(client)
        job_id = running_job(setup)
        assert send(setup, job_id, output, chunk=900) == len(output)
        held = archived(client, job_id)
        assert held >= len(output) - 2 * SEGMENT - 900
        listed = seaweed.client().list_objects_v2(Bucket=BUCKET, Prefix=f"logs/0/{job_id}/1/")
        sizes = {item["Key"].rsplit("/", 1)[1]: item["Size"] for item in listed.get("Contents", [])}
        assert sizes == {str(k): SEGMENT for k in range(held // SEGMENT)}
        middle = client.get(
            f"/api/v1/jobs/{job_id}/logs", headers=setup.user, params={"offset": SEGMENT + 100}
        )
        assert middle.content == output[SEGMENT + 100 : SEGMENT + 800]  # a ranged read of one segment
        assert setup.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
        assert read_whole(client, setup.user, job_id) == output


def test_the_cli_prints_a_long_log_whole(make_settings: MakeSettings, tmp_path: Path) -> None:
    settings = make_settings(log_segment_bytes=SEGMENT, log_read_max_bytes=500)
    output = b"".join(f"line {i:04}\n".encode() for i in range(800))
    with TestClient(create_app(settings)) as client:
        setup = Setup(client)
        job_id = running_job(setup)
        send(setup, job_id, output, chunk=1000)
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg")}
    with Served(create_app(settings), settings) as served:
        login = sxwl(
            "login",
            "--url",
            served.url,
            "--email",
            "dev@example.com",
            "--password-stdin",
            env=env,
            stdin="correct horse\n",
        )
        assert login.returncode == 0, login.stderr
        printed = subprocess.run(
            [sys.executable, "-m", "sxwl.cli", "jobs", "logs", job_id],
            env=env,
            capture_output=True,
            timeout=60,
        )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == output  # in 500-byte answers, the first ones from the store


def progress(step: int) -> bytes:
    line = progress_line(
        Progress.model_validate({"kind": "metrics", "step": step, "total_steps": 1000, "loss": 1.5})
    )
    return (line + "\n").encode()


@pytest.fixture
def capped_fine_tunes(make_client: Callable[..., TestClient]) -> Iterator[FineTunes]:
    yield FineTunes(make_client(log_max_bytes=CAP, log_segment_bytes=SEGMENT))


def test_fine_tune_progress_is_still_read_past_the_cap(capped_fine_tunes: FineTunes) -> None:
    ft = capped_fine_tunes
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    noise = b"warning: something the trainer's libraries print\n"
    output = b"".join(noise * 3 + progress(step) for step in range(1, 60))
    assert len(output) > 5 * CAP
    # Chunks of 256 bytes: progress lines are cut between appends, before the cap and after it.
    assert send(ft, job_id, output, chunk=256) == len(output)
    now = ft.get(fine_tune["id"])
    assert now["progress"]["step"] == 59  # the last line, long past the cap
    steps = [e["data"]["step"] for e in ft.events(fine_tune["id"])["data"] if e["type"] == "metrics"]
    # Every line kept and most dropped ones: only a line split between two appends past the cap is lost.
    assert steps == sorted(steps, reverse=True) and len(steps) > 40
    assert set(range(1, 9)) <= set(steps)  # those before the cap, all of them
    assert stored(ft.client, job_id)[1] + archived(ft.client, job_id) < CAP + 200
