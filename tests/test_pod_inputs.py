"""Inputs of fine-tunes on Kubernetes: the fetcher of a pod's init container (sxwl/agent/pod_fetcher.py)
run as a real process of the machine's own python3 (Debian's 3.11.2 has no tarfile ``data`` filter),
without the project on its path, against a cloud served on a real socket (SQLite and PostgreSQL), with
the upload token of the fine-tune's assignment; the route it calls (``paths.POD_INPUT``); and, with
SeaweedFS, the redirect to the object store that the fetcher follows without the token."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from sxwl.agent import pod_fetcher
from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet import cpods as cpod_service
from sxwl.cloud.storage import Artifact
from sxwl.protocol import PROTOCOL_HEADER, SHA256_HEADER, paths
from sxwl.protocol.finetune import checkpoint_artifact
from tests.conftest import MakeSettings
from tests.support.agent import eventually
from tests.support.cpods import beat, gpu_node
from tests.support.finetune_rows import add_model, store_bytes
from tests.support.input_server import JOB, Served, servers
from tests.support.net import free_port
from tests.support.seaweedfs import SeaweedFS
from tests.support.served import Served as ServedApp
from tests.test_fine_tunes_api import TRAIN, VALID, FineTunes
from tests.test_pod_uploads import PYTHON
from tests.test_s3_artifacts import s3_settings

__all__ = ["servers"]  # the fixture
FETCHER = Path(pod_fetcher.__file__)
MODEL = "tiny-real"
WEIGHTS = os.urandom(2 * 1024 * 1024 + 99)  # several of the fetcher's 1 MiB chunks
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer/vocab.json": b"{}",
    "model.safetensors": WEIGHTS,
}


def tar_of(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """A tar of (name, type, data or link target): what ``tar -C dir .`` writes for a model."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = tarfile.REGTYPE if kind is None else kind
            info.mode = 0o6777  # setuid, setgid, writable by all: none of it survives
            if info.isreg():
                info.size = len(data)
            else:
                info.linkname = data.decode()
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


MODEL_TAR = tar_of(
    ("./", tarfile.DIRTYPE, b""),
    *((f"./{name}", None, data) for name, data in FILES.items()),
)


class Cloud:
    def __init__(self, ft: FineTunes, url: str) -> None:
        self.ft = ft
        self.url = url

    def running(self, model: str = MODEL) -> dict[str, Any]:
        """The assignment of a fine-tune's first attempt, reported running."""
        _, assignment = self.ft.running(model=model)
        return dict(assignment)

    def pod_input(self, job_id: str, attempt: int, name: str, token: str | None) -> httpx.Response:
        url = self.url + paths.url(paths.POD_INPUT, job_id=job_id, attempt=attempt, name=name)
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(url, headers={**auth, PROTOCOL_HEADER: "1"}, timeout=30)


@contextmanager
def cloud_on(settings: Settings) -> Iterator[Cloud]:
    app = create_app(settings)
    with ServedApp(app, settings) as served:
        ft = FineTunes(TestClient(app))
        add_model(ft.ctx, MODEL, MODEL_TAR)
        yield Cloud(ft, served.url)


@pytest.fixture
def cloud(make_settings: MakeSettings) -> Iterator[Cloud]:
    with cloud_on(make_settings()) as made:
        yield made


def fetcher(
    root: Path, url: str, assignment: dict[str, Any], token: str | None = None, **env: str
) -> subprocess.Popen[str]:
    """The fetcher as the init container runs it, by file path, with none of the project importable."""
    (root / "inputs").mkdir(parents=True, exist_ok=True)
    (root / "token").write_text(assignment["upload_token"] if token is None else token)
    (root / "termination-log").write_text("")
    full_env = {
        "PATH": "/usr/bin:/bin",
        "SXWL_UPLOAD_URL": url,
        "SXWL_JOB_ID": assignment["job_id"],
        "SXWL_ATTEMPT": str(assignment["attempt"]),
        "SXWL_UPLOAD_TOKEN_FILE": str(root / "token"),
        "SXWL_INPUTS_DIR": str(root / "inputs"),
        "SXWL_INPUTS": json.dumps(assignment["inputs"]),
        "SXWL_TERMINATION_LOG": str(root / "termination-log"),
        "SXWL_FETCH_RETRY_S": "0.01",
        **env,
    }
    return subprocess.Popen(
        [PYTHON, "-I", str(FETCHER)], env=full_env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def fetch(root: Path, url: str, assignment: dict[str, Any], **kwargs: Any) -> tuple[int, str, str]:
    """(exit status, termination message, stderr) of a whole run."""
    process = fetcher(root, url, assignment, **kwargs)
    _, stderr = process.communicate(timeout=120)
    return process.returncode, (root / "termination-log").read_text(), stderr


def placed(inputs: Path) -> dict[str, int]:
    return {p.relative_to(inputs).as_posix(): p.stat().st_mode & 0o7777 for p in inputs.rglob("*")}


def test_every_input_arrives_checked_unpacked_and_read_only(cloud: Cloud, tmp_path: Path) -> None:
    assignment = cloud.running()
    token = assignment["upload_token"]
    assert [i["name"] for i in assignment["inputs"]] == ["model", "training_file", "validation_file"]
    run = json.dumps({"model_dir": "/sxwl-inputs/model", "training_file": "/sxwl-inputs/training_file"})
    code, message, stderr = fetch(tmp_path, cloud.url, assignment, SXWL_TRAINER_RUN=run)

    assert code == 0, stderr
    assert message == f"ok: 3 inputs ({len(MODEL_TAR) + len(TRAIN) + len(VALID)} bytes) fetched"
    inputs = tmp_path / "inputs"
    expected = {
        "model": 0o555,
        "model/config.json": 0o444,
        "model/model.safetensors": 0o444,
        "model/tokenizer": 0o555,
        "model/tokenizer/vocab.json": 0o444,
        "training_file": 0o444,
        "validation_file": 0o444,
        "trainer-run.json": 0o444,
    }
    assert placed(inputs) == expected
    assert {name: (inputs / "model" / name).read_bytes() for name in FILES} == FILES
    assert (inputs / "training_file").read_bytes() == TRAIN
    assert (inputs / "validation_file").read_bytes() == VALID
    assert (inputs / "trainer-run.json").read_text() == run
    assert token not in stderr + message

    # The init container run again (its pod restarted it) replaces what it finds, read-only or not.
    (tmp_path / "inputs" / ".sxwl-fetch-model.d").mkdir(mode=0o555)  # a run killed half-way
    code, message, stderr = fetch(tmp_path, cloud.url, assignment)
    assert code == 0 and message.startswith("ok: 3 inputs"), stderr
    assert placed(inputs) == expected  # the leftover gone too
    assert (inputs / "model" / "model.safetensors").read_bytes() == WEIGHTS


def test_a_refused_token_ends_the_fetch_at_once_and_leaves_nothing(cloud: Cloud, tmp_path: Path) -> None:
    assignment = cloud.running()
    job_id = assignment["job_id"]
    code, message, stderr = fetch(tmp_path / "wrong", cloud.url, assignment, token="sxup_not-this-one")
    assert code == 1
    assert message == (
        f"error: input model: refused by the cloud (HTTP 403): "
        f"this upload token is not for attempt 1 of job {job_id}"
    )
    assert "try 1 failed" not in stderr  # a refusal is not tried again
    assert list((tmp_path / "wrong" / "inputs").iterdir()) == []

    code, message, _ = fetch(tmp_path / "none", cloud.url, assignment, token="")
    assert code == 1 and message.startswith("error: input model: refused by the cloud (HTTP 401): ")
    code, message, _ = fetch(tmp_path / "cpod", cloud.url, assignment, token=cloud.ft.token)
    assert code == 1 and "(HTTP 403)" in message  # the CPod token is not an upload token


def test_a_stale_attempt_is_refused_and_the_next_one_gets_its_checkpoint_as_a_tar(
    cloud: Cloud, tmp_path: Path
) -> None:
    ft = cloud.ft
    first = cloud.running()
    job_id = first["job_id"]
    checkpoint = tar_of(("trainer_state.json", None, b'{"step": 3}'))
    assert ft.put(job_id, checkpoint_artifact(3), checkpoint).status_code == 201
    cpod_service.sweep_liveness(ft.ctx, utcnow() + timedelta(seconds=40))  # unknown
    cpod_service.sweep_liveness(ft.ctx, utcnow() + timedelta(seconds=200))  # offline → requeued

    code, message, _ = fetch(tmp_path / "old", cloud.url, first)
    assert code == 1
    assert message.startswith(
        f"error: input model: refused by the cloud (HTTP 409): attempt 1 of job {job_id}"
    )
    assert "no longer current" in message

    ft.seq += 1
    beat(ft.client, ft.token, ft.seq, [gpu_node("w1", count=8)])  # the CPod comes back
    for command in ft.poll()["commands"]:
        ft.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=ft.agent)
    (second,) = eventually(lambda: ft.poll()["assignments"], what="the second attempt")
    assert second["attempt"] == 2 and second["upload_token"] != first["upload_token"]
    code, message, stderr = fetch(tmp_path / "new", cloud.url, second)
    assert code == 0 and message.startswith("ok: 4 inputs"), stderr
    resume = tmp_path / "new" / "inputs" / "resume"
    assert resume.is_file() and resume.read_bytes() == checkpoint  # the trainer unpacks it
    assert resume.stat().st_mode & 0o777 == 0o444

    code, message, _ = fetch(tmp_path / "mixed", cloud.url, second, token=first["upload_token"])
    assert code == 1 and "(HTTP 403)" in message  # one attempt's token is not another's


def test_bytes_that_are_not_the_inputs_are_tried_again_then_named(cloud: Cloud, tmp_path: Path) -> None:
    assignment = cloud.running()
    good = hashlib.sha256(TRAIN).hexdigest()
    changed = TRAIN.replace(b"hi", b"ho")  # the same size, other bytes
    store_bytes(cloud.ft.ctx, Artifact("files", 0, "file-train"), changed)
    code, message, stderr = fetch(tmp_path / "sha", cloud.url, assignment)
    assert code == 1
    assert message == (
        f"error: input training_file: not fetched in {pod_fetcher.TRIES} tries: "
        f"sha256 {hashlib.sha256(changed).hexdigest()} is not the expected {good}"
    )
    assert stderr.count("input training_file: try ") == pod_fetcher.TRIES - 1
    assert placed(tmp_path / "sha" / "inputs").keys() == {
        "model",
        *(f"model/{n}" for n in FILES),
        "model/tokenizer",
    }

    def sized(delta: int) -> dict[str, Any]:
        (valid,) = [i for i in assignment["inputs"] if i["name"] == "validation_file"]
        return {**assignment, "inputs": [{**valid, "size": valid["size"] + delta}]}

    code, message, _ = fetch(tmp_path / "long", cloud.url, sized(1))
    assert code == 1 and message.endswith(f"{len(VALID)} bytes arrived, not the expected {len(VALID) + 1}")
    code, message, _ = fetch(tmp_path / "short", cloud.url, sized(-1))
    assert code == 1 and message.endswith(f"more than the expected {len(VALID) - 1} bytes arrived")
    assert list((tmp_path / "short" / "inputs").iterdir()) == []


def test_a_model_whose_tar_leaves_its_dir_is_refused_whole(cloud: Cloud, tmp_path: Path) -> None:
    add_model(cloud.ft.ctx, "escaping", tar_of(("config.json", None, b"{}"), ("../escape.txt", None, b"out")))
    assignment = cloud.running(model="escaping")
    code, message, _ = fetch(tmp_path, cloud.url, assignment)
    assert code == 1
    assert message == "error: input model: cannot unpack the archive: '../escape.txt' leaves the archive (..)"
    assert not (tmp_path / "escape.txt").exists()
    assert list((tmp_path / "inputs").iterdir()) == []


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../x", None, b"out"), "'../x' leaves the archive"),
        (("a/../../x", None, b"out"), "leaves the archive"),
        (("/etc/x", None, b"out"), "'/etc/x' is an absolute name"),
        (("weights.bin", tarfile.SYMTYPE, b"/etc/passwd"), "a symbolic link to '/etc/passwd'"),
        (("inside", tarfile.SYMTYPE, b"config.json"), "a symbolic link to 'config.json'"),
        (("hard", tarfile.LNKTYPE, b"config.json"), "a hard link to 'config.json'"),
        (("null", tarfile.CHRTYPE, b""), "a device or a FIFO"),
        (("fifo", tarfile.FIFOTYPE, b""), "a device or a FIFO"),
        (("config.json", None, b"again"), "'config.json' clashes with another member"),
        (("config.json/x", None, b"under a file"), "'config.json/x' clashes with another member"),
    ],
)
def test_only_regular_files_and_directories_inside_the_archive_unpack(
    tmp_path: Path, member: tuple[str, bytes | None, bytes], why: str
) -> None:
    archive = tmp_path / "model.tar"
    archive.write_bytes(tar_of(("config.json", None, b"{}"), member))
    (tmp_path / "out").mkdir()
    with pytest.raises(pod_fetcher.ArchiveError, match=re.escape(why)):
        pod_fetcher.unpack(archive, tmp_path / "out" / "model")
    assert not (tmp_path / "x").exists() and not (tmp_path / "out" / "x").exists()


def test_the_route_takes_the_attempts_upload_token_and_the_cpod_keeps_its_own(cloud: Cloud) -> None:
    ft = cloud.ft
    assignment = cloud.running()
    job_id, token = assignment["job_id"], assignment["upload_token"]
    got = cloud.pod_input(job_id, 1, "training_file", token)
    assert got.status_code == 200 and got.content == TRAIN
    assert got.headers[SHA256_HEADER] == hashlib.sha256(TRAIN).hexdigest()
    assert got.headers["cache-control"] == "private, no-store"

    refused = cloud.pod_input(job_id, 1, "training_file", ft.token)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_your_upload"
    assert cloud.pod_input(job_id, 1, "training_file", None).status_code == 401
    assert cloud.pod_input(job_id, 2, "training_file", token).status_code == 403
    unknown = cloud.pod_input(job_id, 1, "resume", token)
    assert unknown.status_code == 404
    assert "its inputs: model, training_file, validation_file" in unknown.json()["error"]["message"]
    own = ft.fetch(job_id, "training_file")  # the CPod token on the agent's route, as before
    assert own.status_code == 200 and own.content == TRAIN
    assert own.headers[SHA256_HEADER] == got.headers[SHA256_HEADER]

    # An attempt that ended needs no inputs.
    assert ft.status(job_id, 1, "failed", exit_code=1).status_code == 200
    ended = cloud.pod_input(job_id, 1, "training_file", token)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "inputs_closed"


def test_sigterm_stops_the_fetch_at_once(servers: tuple[Served, Served], tmp_path: Path) -> None:
    stub, _ = servers
    data = b"x" * 1000
    path = pod_fetcher.INPUT_PATH.format(job_id=JOB, attempt=1, name="training_file")
    stub.bodies[path] = data
    stub.held[path] = threading.Event()  # the answer stalls after its first byte
    item = {"name": "training_file", "sha256": hashlib.sha256(data).hexdigest(), "size": 1000}
    assignment = {"job_id": JOB, "attempt": 1, "inputs": [item], "upload_token": "sxup_t"}
    process = fetcher(tmp_path, stub.url, assignment)
    eventually(lambda: stub.seen, timeout=30, what="the request")
    time.sleep(0.2)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    stub.held[path].set()
    assert process.returncode == 1 and time.monotonic() - started < 5
    assert (tmp_path / "termination-log").read_text() == "error: stopped (the pod is being deleted)"
    assert list((tmp_path / "inputs").iterdir()) == []  # no half file


def test_a_cloud_that_does_not_answer_is_tried_again_with_backoff(tmp_path: Path) -> None:
    item = {"name": "training_file", "sha256": "0" * 64, "size": 1}
    assignment = {"job_id": JOB, "attempt": 1, "inputs": [item], "upload_token": "sxup_t"}
    code, message, stderr = fetch(tmp_path, f"http://127.0.0.1:{free_port()}", assignment)
    assert code == 1
    assert message.startswith(f"error: input training_file: not fetched in {pod_fetcher.TRIES} tries: ")
    assert "ConnectionRefusedError" in message
    delays = re.findall(r"again in ([0-9.]+) s", stderr)
    assert delays == ["0.01", "0.02", "0.04", "0.08"]  # SXWL_FETCH_RETRY_S, doubled each try


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A GET-only proxy in front of the object store, its URL the presigned URLs' origin: it records
    what reached the store (path, Authorization) and passes the Host on, which the signature covers."""
    seen: list[tuple[str, str | None]] = []
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            connection = HTTPConnection(target.hostname or "", target.port, timeout=30)
            connection.request("GET", self.path, headers={"Host": self.headers["Host"]})
            answer = connection.getresponse()
            body = answer.read()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in (
                    "content-length",
                    "connection",
                    "transfer-encoding",
                    "server",
                    "date",
                ):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            connection.close()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_on_s3_the_fetcher_follows_the_redirect_without_the_token(
    make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    with recording_proxy(seaweed.endpoint) as (public, seen):
        settings = s3_settings(make_settings, seaweed, tmp_path, s3_public_endpoint=public)
        with cloud_on(settings) as cloud:
            assignment = cloud.running()
            code, message, stderr = fetch(tmp_path / "pod", cloud.url, assignment)
    assert code == 0 and message.startswith("ok: 3 inputs"), stderr
    inputs = tmp_path / "pod" / "inputs"
    assert (inputs / "model" / "model.safetensors").read_bytes() == WEIGHTS
    assert (inputs / "training_file").read_bytes() == TRAIN
    assert len(seen) == 3 and all("X-Amz-Signature=" in path for path, _ in seen)
    assert [auth for _, auth in seen] == [None, None, None]  # the token never reached the store


def test_the_fetcher_speaks_the_protocol_it_cannot_import() -> None:
    assert pod_fetcher.PROTOCOL_HEADER == PROTOCOL_HEADER
    assert pod_fetcher.SHA256_HEADER == SHA256_HEADER
    filled = paths.url(paths.POD_INPUT, job_id="j", attempt=2, name="model")
    assert pod_fetcher.INPUT_PATH.format(job_id="j", attempt=2, name="model") == filled
