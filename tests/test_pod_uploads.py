"""Artifacts from Kubernetes pods: the uploader program (sxwl/agent/pod_uploader.py) run as a real
process of the machine's own python3, without the project on its path, against a cloud served on a
real socket (SQLite and PostgreSQL), with the upload token the cloud hands out in the assignment."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from sxwl.agent import pod_uploader
from sxwl.cloud.app import create_app
from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.db.types import utcnow
from sxwl.protocol import PROTOCOL_HEADER, SHA256_HEADER, paths
from sxwl.protocol.finetune import CHECKPOINT_DIR, checkpoint_artifact
from tests.conftest import MakeSettings
from tests.support.agent import eventually
from tests.support.served import Served
from tests.test_cpods_api import ctx_of
from tests.test_jobs_api import Setup

UPLOADER = Path(pod_uploader.__file__)
LIMIT = 4 * 1024 * 1024  # the cloud's artifact limit in these tests
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


class Cloud:
    def __init__(self, setup: Setup, url: str) -> None:
        self.setup = setup
        self.url = url

    def running_attempt(self) -> dict[str, Any]:
        """A job placed on the test's CPod and running; its assignment (with the upload token)."""
        job = self.setup.submit()
        # Polled again, as an agent does, while nothing came: one 5 s long-poll can end before a
        # loaded machine's scheduler pass places the job (a CI run's PostgreSQL case did).
        (assignment,) = eventually(
            lambda: self.setup.poll()["assignments"], timeout=60, what="the job placed"
        )
        assert assignment["job_id"] == job["id"]
        assert self.setup.status(job["id"], assignment["attempt"], "running").status_code == 200
        return dict(assignment)

    def artifacts(self, job_id: str) -> dict[str, tuple[int, str]]:
        listed = self.setup.client.get(f"/api/v1/jobs/{job_id}/artifacts", headers=self.setup.user)
        return {a["path"]: (a["size"], a["sha256"]) for a in listed.json()}


@pytest.fixture
def cloud(make_settings: MakeSettings) -> Iterator[Cloud]:
    settings = make_settings(artifact_max_bytes=LIMIT)
    app = create_app(settings)
    with Served(app, settings) as served:
        # The same application in-process (its lifespan is the served one's) for the test's own calls.
        yield Cloud(Setup(TestClient(app)), served.url)


def pod_dir(root: Path, token: str, files: dict[str, bytes], exit_code: int | None = 0) -> Path:
    """What a pod's uploader sees: the shared volume with the output and the wrapper's exit-code,
    and the token file of its Secret."""
    shared = root / "sxwl"
    for name, data in files.items():
        (shared / "output" / name).parent.mkdir(parents=True, exist_ok=True)
        (shared / "output" / name).write_bytes(data)
    shared.mkdir(parents=True, exist_ok=True)
    if exit_code is not None:
        (shared / "exit-code").write_text(f"{exit_code}\n")
    (root / "token").write_text(token)
    (root / "token").chmod(0o400)
    return shared


def uploader_env(root: Path, cloud: Cloud, assignment: dict[str, Any], **env: str) -> dict[str, str]:
    (root / "termination-log").write_text("")
    return {
        "PATH": "/usr/bin:/bin",
        "SXWL_UPLOAD_URL": cloud.url,
        "SXWL_JOB_ID": assignment["job_id"],
        "SXWL_ATTEMPT": str(assignment["attempt"]),
        "SXWL_UPLOAD_TOKEN_FILE": str(root / "token"),
        "SXWL_SHARED_DIR": str(root / "sxwl"),
        "SXWL_TERMINATION_LOG": str(root / "termination-log"),
        **env,
    }


def run_uploader(
    root: Path, cloud: Cloud, assignment: dict[str, Any], **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The uploader as a pod runs it, by file path, with none of the project's packages importable."""
    done = subprocess.run(
        [PYTHON, "-I", str(UPLOADER)],
        env=uploader_env(root, cloud, assignment, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, (root / "termination-log").read_text()


def test_the_uploader_streams_every_regular_file_and_the_cloud_checks_its_sha256(
    cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assignment = cloud.running_attempt()
    token = assignment["upload_token"]
    assert token and token.startswith("sxup_")
    model = os.urandom(3 * 1024 * 1024 + 12345)  # several chunks of the uploader's 1 MiB
    shared = pod_dir(tmp_path, token, {"ckpt/model.bin": model, "metrics.json": b'{"loss": 1.5}'})
    outside = tmp_path / "secret.txt"
    outside.write_text("not an artifact")
    (shared / "output" / "link.txt").symlink_to(outside)  # links are skipped, never followed
    (shared / "output" / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(shared / "output" / "a-fifo")  # not a regular file: skipped, never opened

    done, message = run_uploader(tmp_path, cloud, assignment)
    assert done.returncode == 0, done.stderr
    assert message == f"ok: 2 files ({len(model) + 13} bytes) uploaded", done.stderr
    stored = cloud.artifacts(assignment["job_id"])
    assert stored == {
        "ckpt/model.bin": (len(model), hashlib.sha256(model).hexdigest()),
        "metrics.json": (13, hashlib.sha256(b'{"loss": 1.5}').hexdigest()),
    }
    got = cloud.setup.client.get(
        f"/api/v1/jobs/{assignment['job_id']}/artifacts/ckpt/model.bin", headers=cloud.setup.user
    )
    assert got.content == model

    # A rank of a multi-node job puts its files under rank-<N>/.
    done, message = run_uploader(tmp_path, cloud, assignment, NNODES="2", NODE_RANK="1")
    assert message.startswith("ok: 2 files"), done.stderr
    assert {"rank-1/ckpt/model.bin", "rank-1/metrics.json"} <= cloud.artifacts(assignment["job_id"]).keys()

    # The token is in no log line: not the uploader's, not the cloud's (access log included).
    assert token not in done.stdout + done.stderr + message
    # Every field of every record, not only the text a formatter makes of it: the access log keeps
    # the path in a field of its own, which the formatter of a whole-suite run may leave out.
    fields = [str(vars(record)) for record in caplog.records]
    assert not [f for f in fields if token in f]
    assert any("/uploads/" in f for f in fields)  # the access log was captured


def written_by_rename(path: Path, data: bytes) -> None:
    """As the trainer writes a checkpoint: under a dot-name beside it, then renamed."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def until(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Polls gently, with a deadline far above the uploader's listing interval: the machine may be
    slow and loaded, and what is checked is the order of events, not their timing."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_checkpoints_are_uploaded_while_the_main_container_runs_and_only_once(
    cloud: Cloud, tmp_path: Path
) -> None:
    assignment = cloud.running_attempt()
    job_id = assignment["job_id"]
    shared = pod_dir(tmp_path, assignment["upload_token"], {"log.txt": b"step 1"}, exit_code=None)
    checkpoints = shared / "output" / CHECKPOINT_DIR
    checkpoints.mkdir()
    # The main container lives while the FIFO has a writer; the wrapper holds it from before the
    # FIFO has its name (kube_wrapper.py).
    os.mkfifo(shared / ".alive")
    alive = os.open(shared / ".alive", os.O_RDWR)
    (shared / ".alive").replace(shared / "alive")
    uploader = subprocess.Popen(
        [PYTHON, "-I", str(UPLOADER)],
        env=uploader_env(tmp_path, cloud, assignment, NNODES="2", NODE_RANK="1"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first, second = os.urandom(2 * 1024 * 1024 + 7), os.urandom(5000)
        in_progress = checkpoints / f".{Path(checkpoint_artifact(20)).name}.partial"
        in_progress.write_bytes(second[:1000])  # still being written while the uploader lists
        written_by_rename(shared / "output" / checkpoint_artifact(10), first)
        until(lambda: f"rank-1/{checkpoint_artifact(10)}" in cloud.artifacts(job_id), "the first checkpoint")

        assert uploader.poll() is None and not (shared / "exit-code").exists()  # the main still runs
        # Only the checkpoint, whole: neither the file in progress nor the other output.
        assert cloud.artifacts(job_id) == {
            f"rank-1/{checkpoint_artifact(10)}": (len(first), hashlib.sha256(first).hexdigest())
        }

        # The second checkpoint is finished and the main ends: whether a listing catches it first or
        # the upload at the end, it goes once, as every other file.
        with in_progress.open("ab") as handle:
            handle.write(second[1000:])
        in_progress.replace(shared / "output" / checkpoint_artifact(20))
        (shared / "output" / "adapter.tar").write_bytes(b"adapter")
        (shared / ".exit-code").write_text("0\n")
        (shared / ".exit-code").replace(shared / "exit-code")
        os.close(alive)
        alive = -1
        _, stderr = uploader.communicate(timeout=300)
    finally:
        if alive >= 0:
            os.close(alive)
        if uploader.poll() is None:
            uploader.kill()
            uploader.wait(30)
    assert uploader.returncode == 0, stderr
    message = (tmp_path / "termination-log").read_text()
    sizes = len(first) + len(second) + len(b"step 1") + len(b"adapter")
    assert message == f"ok: 4 files ({sizes} bytes) uploaded", stderr
    assert cloud.artifacts(job_id) == {
        f"rank-1/{checkpoint_artifact(10)}": (len(first), hashlib.sha256(first).hexdigest()),
        f"rank-1/{checkpoint_artifact(20)}": (len(second), hashlib.sha256(second).hexdigest()),
        "rank-1/log.txt": (6, hashlib.sha256(b"step 1").hexdigest()),
        "rank-1/adapter.tar": (7, hashlib.sha256(b"adapter").hexdigest()),
    }


def test_a_file_over_the_limit_is_named_in_the_termination_message(cloud: Cloud, tmp_path: Path) -> None:
    assignment = cloud.running_attempt()
    big = os.urandom(LIMIT + 1)
    pod_dir(tmp_path, assignment["upload_token"], {"big.bin": big, "small.txt": b"ok"}, exit_code=3)
    done, message = run_uploader(tmp_path, cloud, assignment)
    assert done.returncode == 0  # a failed upload never fails the pod (the other ranks go on)
    assert (
        message == f"error: artifact big.bin refused: larger than {LIMIT} bytes (1 file (2 bytes) uploaded)"
    )
    assert cloud.artifacts(assignment["job_id"]).keys() == {"small.txt"}


def put(cloud: Cloud, assignment: dict[str, Any], path: str, data: bytes, **headers: str) -> httpx.Response:
    url = paths.url(
        paths.UPLOAD_ARTIFACT, job_id=assignment["job_id"], attempt=assignment["attempt"], path=path
    )
    token = headers.pop("token", assignment["upload_token"])
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.put(
        cloud.url + url, content=data, headers={**auth, PROTOCOL_HEADER: "1", **headers}, timeout=30
    )


def test_bytes_that_do_not_match_their_sha256_are_refused_and_nothing_is_stored(cloud: Cloud) -> None:
    assignment = cloud.running_attempt()
    good = b"weights v1"
    assert (
        put(cloud, assignment, "m.bin", good, **{SHA256_HEADER: hashlib.sha256(good).hexdigest()}).status_code
        == 201
    )
    wrong = put(
        cloud, assignment, "n.bin", b"weights v2", **{SHA256_HEADER: hashlib.sha256(b"other").hexdigest()}
    )
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "digest_mismatch"
    assert wrong.json()["error"]["details"][0]["field"] == SHA256_HEADER
    malformed = put(cloud, assignment, "o.bin", b"x", **{SHA256_HEADER: "not-hex"})
    assert malformed.status_code == 422 and SHA256_HEADER in malformed.text
    # The earlier upload of the path is untouched, on disk and in the record.
    assert cloud.artifacts(assignment["job_id"]) == {"m.bin": (len(good), hashlib.sha256(good).hexdigest())}
    got = cloud.setup.client.get(
        f"/api/v1/jobs/{assignment['job_id']}/artifacts/m.bin", headers=cloud.setup.user
    )
    assert got.content == good

    # The CPod's own route (the local runtime's uploads) checks the same header.
    agent_put = cloud.setup.client.put(
        f"/api/v1/agent/jobs/{assignment['job_id']}/artifacts/n.bin?attempt={assignment['attempt']}",
        headers={**cloud.setup.agent, SHA256_HEADER: "0" * 64},
        content=b"weights v3",
    )
    assert agent_put.status_code == 422 and agent_put.json()["error"]["code"] == "digest_mismatch"
    assert cloud.artifacts(assignment["job_id"])["m.bin"][0] == len(good)


def test_a_token_uploads_only_for_its_own_current_attempt(cloud: Cloud, tmp_path: Path) -> None:
    first = cloud.running_attempt()
    second = cloud.running_attempt()
    assert first["upload_token"] != second["upload_token"]
    # A copy of the assignment handed out again carries the same token.
    job = cloud.setup.submit()
    again = [cloud.setup.poll()["assignments"][0] for _ in range(2)]
    assert again[0]["job_id"] == job["id"] and again[0]["upload_token"] == again[1]["upload_token"]

    assert put(cloud, first, "a.txt", b"x", token="").status_code == 401
    assert put(cloud, first, "a.txt", b"x", token=second["upload_token"]).status_code == 403
    assert put(cloud, first, "a.txt", b"x", token=cloud.setup.token).status_code == 403  # the CPod token
    other_attempt = {**first, "attempt": first["attempt"] + 1}
    assert put(cloud, other_attempt, "a.txt", b"x", token=first["upload_token"]).status_code == 403
    # The token reads nothing: not the job, not its artifacts.
    bearer = {"Authorization": f"Bearer {first['upload_token']}"}
    assert httpx.get(f"{cloud.url}/api/v1/jobs/{first['job_id']}", headers=bearer).status_code == 401

    # Lost and requeued: the old attempt's token is fenced (409), the uploader says so and stops.
    lost = cloud.setup.status(first["job_id"], first["attempt"], "lost", reason="node died")
    assert lost.status_code == 200
    stale = put(cloud, first, "a.txt", b"x")
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
    pod_dir(tmp_path, first["upload_token"], {"a.txt": b"x", "b.txt": b"y"})
    done, message = run_uploader(tmp_path, cloud, first)
    assert message.startswith("error: artifacts refused by the cloud: attempt 1"), done.stderr
    assert message.endswith("(0 files (0 bytes) uploaded)")
    assert cloud.artifacts(first["job_id"]) == {}

    # Ended: accepted for a while (ranks the Job controller stops finish), then refused.
    assert (
        cloud.setup.status(second["job_id"], second["attempt"], "succeeded", exit_code=0).status_code == 200
    )
    assert put(cloud, second, "late.txt", b"late").status_code == 201
    with ctx_of(cloud.setup.client).db.session() as session:
        session.execute(
            update(JobAttempt)
            .where(JobAttempt.job_id == second["job_id"])
            .values(finished_at=utcnow() - timedelta(hours=1))
        )
    closed = put(cloud, second, "later.txt", b"later")
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "upload_closed"
    assert cloud.artifacts(second["job_id"]).keys() == {"late.txt"}


def test_the_uploader_speaks_the_protocol_it_cannot_import() -> None:
    assert pod_uploader.PROTOCOL_HEADER == PROTOCOL_HEADER
    assert pod_uploader.SHA256_HEADER == SHA256_HEADER
    filled = paths.url(paths.UPLOAD_ARTIFACT, job_id="j", attempt=2, path="a/b")
    assert pod_uploader.UPLOAD_PATH.format(job_id="j", attempt=2, path="a/b") == filled
    assert pod_uploader.CHECKPOINT_DIR == CHECKPOINT_DIR


def test_a_directory_swapped_for_a_link_after_the_listing_is_never_read_through(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    secret = tmp_path / "sxwl-upload"
    secret.mkdir()
    (secret / "token").write_text("sxup_secret")
    checkpoints = shared / "output" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "token").write_text("a checkpoint")
    ((name, path),) = pod_uploader.checkpoint_files(shared / "output")
    assert name == "checkpoints/token"
    # The main container swaps the listed dir for a link to where the uploader keeps its token.
    shutil.rmtree(checkpoints)
    checkpoints.symlink_to(secret)
    with pytest.raises(OSError):
        pod_uploader.sha256_of(path, shared)
    # An ordinary file opens.
    (shared / "output" / "log.txt").write_text("ok")
    assert pod_uploader.sha256_of(shared / "output" / "log.txt", shared)[1] == 2
