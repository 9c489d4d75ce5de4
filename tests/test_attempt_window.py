"""Writes end when the attempt ends (services/jobs/attempt_window.py), for every credential: the CPod token
on the agent's routes (through the agent's own client) and the attempt's upload token on the pods'
routes (through the pod uploader run as a real process), against a cloud served on a real socket
with the local artifact store (SQLite and PostgreSQL). An ended attempt reads no input; past the
grace it writes nothing; and what an attempt recorded, a registered adapter above all, is never
replaced. tests/test_s3_write_once.py does the same against a real S3 store."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from starlette.responses import FileResponse

from sxwl.agent.client import Rejected
from sxwl.cloud.db.finetune_models import CatalogModel
from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.jobs.attempt_window import UPLOAD_AFTER_END_S
from sxwl.cloud.storage import AlreadyStored, Artifact
from sxwl.cloud.storage.local import LocalArtifactStore
from sxwl.protocol import PROTOCOL_HEADER, SHA256_HEADER, paths
from sxwl.protocol.finetune import checkpoint_artifact
from tests.conftest import MakeSettings
from tests.support.agent import eventually
from tests.test_fine_tunes_api import FineTunes
from tests.test_pod_inputs import cloud_on
from tests.test_pod_uploads import Cloud, pod_dir, put, run_uploader
from tests.test_s3_artifacts import announce, done, target, upload


@pytest.fixture
def cloud(make_settings: MakeSettings) -> Iterator[Cloud]:
    with cloud_on(make_settings()) as served:
        yield Cloud(served.ft, served.url)


def ft_of(cloud: Cloud) -> FineTunes:
    assert isinstance(cloud.setup, FineTunes)
    return cloud.setup


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cpod_put(cloud: Cloud, assignment: dict[str, Any], path: str, data: bytes) -> httpx.Response:
    """The CPod token's route for bytes streamed through the cloud, with their sha256, as the agent sends."""
    url = paths.url(paths.JOB_ARTIFACT, job_id=assignment["job_id"], path=path)
    headers = {**cloud.setup.agent, SHA256_HEADER: sha(data)}
    answer: httpx.Response = cloud.setup.client.put(
        f"{url}?attempt={assignment['attempt']}", headers=headers, content=data
    )
    return answer


def pod_done(cloud: Cloud, assignment: dict[str, Any], body: dict[str, object]) -> httpx.Response:
    url = paths.url(paths.POD_UPLOAD_DONE, job_id=assignment["job_id"], attempt=assignment["attempt"])
    auth = {"Authorization": f"Bearer {assignment['upload_token']}", PROTOCOL_HEADER: "1"}
    return httpx.post(cloud.url + url, headers=auth, json=body, timeout=30)


def pod_input(cloud: Cloud, assignment: dict[str, Any], name: str) -> httpx.Response:
    url = paths.url(paths.POD_INPUT, job_id=assignment["job_id"], attempt=assignment["attempt"], name=name)
    auth = {"Authorization": f"Bearer {assignment['upload_token']}", PROTOCOL_HEADER: "1"}
    return httpx.get(cloud.url + url, headers=auth, timeout=30)


def ended_ago(cloud: Cloud, job_id: str, seconds: float) -> None:
    with ft_of(cloud).ctx.db.session() as session:
        session.execute(
            update(JobAttempt)
            .where(JobAttempt.job_id == job_id)
            .values(finished_at=utcnow() - timedelta(seconds=seconds))
        )


def code_of(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


def written(tmp_path: Path, data: bytes, name: str = "out.bin") -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def test_an_ended_attempt_reads_nothing_and_writes_only_within_the_grace_whatever_the_credential(
    cloud: Cloud, tmp_path: Path
) -> None:
    ft = ft_of(cloud)
    _, assignment = ft.running()
    job_id = assignment["job_id"]
    assert ft.fetch(job_id, "training_file").status_code == 200
    assert pod_input(cloud, assignment, "training_file").status_code == 200
    assert ft.status(job_id, 1, "failed", exit_code=1).status_code == 200

    # Its inputs are closed the moment it ends, for the CPod token as for the upload token.
    assert code_of(ft.fetch(job_id, "training_file")) == (409, "inputs_closed")
    assert code_of(pod_input(cloud, assignment, "training_file")) == (409, "inputs_closed")

    # The final uploads within the grace: the agent's client and the pod's uploader, real calls both.
    upload(cloud, assignment, "agent-final.txt", written(tmp_path, b"the agent's last output"))
    pod_dir(tmp_path / "pod", assignment["upload_token"], {"pod-final.txt": b"a rank's last output"})
    _, message = run_uploader(tmp_path / "pod", cloud, assignment)
    assert message.startswith("ok: 1 file"), message
    ended_ago(cloud, job_id, UPLOAD_AFTER_END_S - 30)
    assert cpod_put(cloud, assignment, "cpod-late.txt", b"late").status_code == 201
    assert put(cloud, assignment, "pod-late.txt", b"late").status_code == 201
    before = cloud.artifacts(job_id)
    assert before.keys() == {"agent-final.txt", "pod-final.txt", "cpod-late.txt", "pod-late.txt"}

    # Past the grace: refused on every route, for every credential, and nothing is stored.
    ended_ago(cloud, job_id, UPLOAD_AFTER_END_S + 1)
    body = announce(b"too late", "closed.txt")
    token = assignment["upload_token"]
    for answer in (
        cpod_put(cloud, assignment, "closed.txt", b"too late"),
        put(cloud, assignment, "closed.txt", b"too late"),
        target(cloud, assignment, body),
        target(cloud, assignment, body, token),
        done(cloud, assignment, body),
        pod_done(cloud, assignment, body),
    ):
        assert code_of(answer) == (409, "upload_closed"), answer.text
        assert "ended more than 900 s ago" in answer.json()["error"]["message"]
    with pytest.raises(Rejected, match="takes no more artifacts"):
        upload(cloud, assignment, "closed.txt", written(tmp_path, b"too late"))
    (tmp_path / "pod" / "sxwl" / "output" / "closed.txt").write_bytes(b"too late")
    _, message = run_uploader(tmp_path / "pod", cloud, assignment)
    assert message.startswith("error: artifacts refused by the cloud: attempt 1"), message
    assert code_of(ft.fetch(job_id, "training_file")) == (409, "inputs_closed")
    assert cloud.artifacts(job_id) == before
    stored = ft.ctx.settings.data_dir / "artifacts" / job_id
    assert sorted(p.name for p in stored.iterdir()) == sorted(before)


def test_what_an_attempt_recorded_is_never_replaced_and_a_registered_adapter_keeps_its_bytes(
    cloud: Cloud, tmp_path: Path
) -> None:
    ft = ft_of(cloud)
    fine_tune, assignment = ft.running()
    job_id, token = assignment["job_id"], assignment["upload_token"]
    checkpoint = b"checkpoint at step 5"
    assert cpod_put(cloud, assignment, checkpoint_artifact(5), checkpoint).status_code == 201
    # A repeat after a lost answer: the same bytes, accepted, and nothing changes.
    assert cpod_put(cloud, assignment, checkpoint_artifact(5), checkpoint).status_code == 201
    assert (
        put(
            cloud, assignment, checkpoint_artifact(5), checkpoint, **{SHA256_HEADER: sha(checkpoint)}
        ).status_code
        == 201
    )
    # Other bytes, while the attempt runs: refused for both credentials, before a byte is stored.
    assert code_of(cpod_put(cloud, assignment, checkpoint_artifact(5), b"forged")) == (409, "artifact_exists")
    assert code_of(put(cloud, assignment, checkpoint_artifact(5), b"forged")) == (409, "artifact_exists")
    (resume,) = [i for i in ft.job_row(job_id).inputs if i["name"] == "resume"]
    assert resume["sha256"] == sha(checkpoint)

    adapter = b"adapter_config.json and adapter_model.safetensors"
    upload(cloud, assignment, "adapter.tar", written(tmp_path, adapter, "adapter.tar"))
    assert ft.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    name = ft.get(fine_tune["id"])["fine_tuned_model"]
    assert name is not None

    # Within the grace, after registration: no route takes other bytes for adapter.tar.
    forged = b"a forged adapter, same length as the real" + b"!" * 9
    body = announce(forged, "adapter.tar")
    for answer in (
        cpod_put(cloud, assignment, "adapter.tar", forged),
        put(cloud, assignment, "adapter.tar", forged, **{SHA256_HEADER: sha(forged)}),
        target(cloud, assignment, body),
        target(cloud, assignment, body, token),
        done(cloud, assignment, body),
        pod_done(cloud, assignment, body),
    ):
        assert code_of(answer) == (409, "artifact_exists"), answer.text
        assert answer.json()["error"]["details"] == {"path": "adapter.tar", "sha256": sha(adapter)}
    shared = pod_dir(tmp_path / "pod", token, {"adapter.tar": forged})
    with pytest.raises(Rejected, match="written once"):
        upload(cloud, assignment, "adapter.tar", shared / "output" / "adapter.tar")
    _, message = run_uploader(tmp_path / "pod", cloud, assignment)
    assert message.startswith("error: artifact adapter.tar refused:") and "written once" in message
    # The same bytes again are still a harmless repeat.
    assert cpod_put(cloud, assignment, "adapter.tar", adapter).status_code == 201

    # The owner's download, and the job's artifact, are the adapter that was registered.
    content = ft.client.get(f"/api/v1/models/{name}/content", headers=ft.user)
    assert content.status_code == 200 and content.content == adapter
    assert ft.client.get(f"/api/v1/jobs/{job_id}/artifacts/adapter.tar", headers=ft.user).content == adapter
    assert cloud.artifacts(job_id)["adapter.tar"] == (len(adapter), sha(adapter))
    with ft.ctx.db.session() as session:
        model = session.get(CatalogModel, name)
        assert model is not None and model.sha256 == sha(adapter) and model.bytes == len(adapter)


def test_the_local_store_writes_each_attempts_address_once(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    job = "0" * 32

    def put(attempt: int, data: bytes, path: str = "adapter.tar") -> tuple[int, str]:
        async def chunks() -> Any:
            for start in range(0, len(data), 7):
                yield data[start : start + 7]

        with ThreadPoolExecutor(1) as pool:  # off the test's thread: never asyncio.run on it
            return pool.submit(
                asyncio.run, store.put(Artifact(job, attempt, path), chunks(), 1 << 20, once=True)
            ).result()

    def stored(attempt: int, path: str = "adapter.tar") -> bytes:
        response = store.download(Artifact(job, attempt, path), {}, "application/octet-stream")
        assert isinstance(response, FileResponse)
        return Path(response.path).read_bytes()

    first, later = b"attempt 1's adapter", b"attempt 2's other adapter"
    assert put(1, first) == (len(first), sha(first))
    assert put(1, first) == (len(first), sha(first))  # the same bytes: a repeat, nothing changes
    with pytest.raises(AlreadyStored):
        put(1, later)
    assert put(2, later) == (len(later), sha(later))  # a later attempt has an address of its own
    assert stored(1) == first and stored(2) == later
    assert not list((tmp_path / "artifacts").rglob(".upload-*"))  # no temporary file is left

    # Of two puts of other bytes racing for one address, one is stored whole and the other refused.
    contenders = [os.urandom(300_000), os.urandom(300_000)]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda data: _outcome(lambda: put(3, data, "race.bin")), contenders))
    assert sorted(outcomes) == ["AlreadyStored", "stored"]
    assert stored(3, "race.bin") == contenders[outcomes.index("stored")]

    # A later attempt's artifact stored before attempts had addresses of their own is still found.
    legacy = tmp_path / "artifacts" / job / "old.txt"
    legacy.write_bytes(b"stored by attempt 4 in the shared layout")
    assert stored(4, "old.txt") == legacy.read_bytes()


def _outcome(call: Any) -> str:
    try:
        call()
    except AlreadyStored:
        return "AlreadyStored"
    return "stored"


def test_a_later_attempt_stores_its_own_bytes_and_the_resume_input_keeps_the_earlier_ones(
    cloud: Cloud,
) -> None:
    ft = ft_of(cloud)
    _, first = ft.running()
    job_id = first["job_id"]
    checkpoint = b"attempt 1's checkpoint at step 3"
    assert cpod_put(cloud, first, checkpoint_artifact(3), checkpoint).status_code == 201
    assert cpod_put(cloud, first, "notes.txt", b"attempt 1's notes").status_code == 201
    assert ft.status(job_id, 1, "lost", reason="node died").status_code == 200
    for command in ft.poll()["commands"]:
        ft.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=ft.agent)
    (second,) = eventually(lambda: ft.poll()["assignments"], what="the second attempt")
    assert second["attempt"] == 2 and ft.status(job_id, 2, "running").status_code == 200
    # The old attempt is fenced; the new one writes the same path at its own address.
    assert code_of(cpod_put(cloud, first, "notes.txt", b"stale"))[1] == "stale_attempt"
    assert cpod_put(cloud, second, "notes.txt", b"attempt 2's notes").status_code == 201
    got = ft.client.get(f"/api/v1/jobs/{job_id}/artifacts/notes.txt", headers=ft.user)
    assert got.content == b"attempt 2's notes"
    # The resume input still names attempt 1's checkpoint, and its bytes are those.
    resumed = ft.fetch(job_id, "resume", attempt=2)
    assert resumed.status_code == 200 and resumed.content == checkpoint
