"""A job on the local runtime keeps its outputs whatever directories the cloud and the agent were
started with: every path the agent gives a job is absolute, so what the job writes to
``$SXWL_OUTPUT_DIR`` is where the agent collects artifacts (docs/agent.md, "Isolation").

The demo runs the way ``make run`` runs it: ``sxwl up`` in a working directory of its own with the
default, relative data dir ``./.sxwl``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.agent.runtimes.sandbox import detect
from sxwl.agent.runtimes.sandbox_mounts import JOB_OUTPUT, JOB_WORK
from sxwl.cloud.config import Settings
from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.net import free_port
from tests.support.places import private_dir

__all__ = ["private_dir"]  # the fixture

np = pytest.importorskip("numpy", reason="the demo's tiny-lm needs numpy: pip install -e '.[examples]'")

FAST = {"SXWL_ARGON2_TIME_COST": "1", "SXWL_ARGON2_MEMORY_KIB": "1024"}


@pytest.fixture(autouse=True)
def absolute_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes here run in another working directory: a relative PYTHONPATH (``src``) would
    make them import another copy of sxwl."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(Path(e).resolve()) for e in entries if e))
    monkeypatch.delenv("SXWL_DATA_DIR", raising=False)


def sign_in(url: str, email: str, password: str) -> dict[str, str]:
    response = httpx.post(f"{url}/api/v1/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def downloaded(url: str, job_id: str, headers: dict[str, str]) -> dict[str, bytes]:
    """Every artifact of the job, downloaded, checked against the size and sha256 it is listed with."""
    listed: list[dict[str, Any]] = httpx.get(f"{url}/api/v1/jobs/{job_id}/artifacts", headers=headers).json()
    files = {}
    for artifact in listed:
        got = httpx.get(f"{url}/api/v1/jobs/{job_id}/artifacts/{artifact['path']}", headers=headers)
        assert got.status_code == 200, got.text
        assert len(got.content) == artifact["size"]
        assert hashlib.sha256(got.content).hexdigest() == artifact["sha256"]
        files[artifact["path"]] = got.content
    return files


def console_job_page(url: str, email: str, password: str, job_id: str) -> str:
    with httpx.Client(base_url=url) as browser:
        form = browser.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert token, form.text
        signed_in = browser.post(
            "/login", data={"csrf_token": token.group(1), "email": email, "password": password}
        )
        assert signed_in.status_code in (200, 303), signed_in.text
        page = browser.get(f"/jobs/{job_id}")
        assert page.status_code == 200, page.text
        return page.text


@pytest.mark.parametrize("where", ["tmp", "private"])
def test_make_run_keeps_the_demo_checkpoint(where: str, tmp_path: Path, private_dir: Path) -> None:
    """From a working dir below /tmp (which a job's sandbox replaces), and from one below a dir the
    job's uid cannot search, with spaces in its path (a clone in root's home)."""
    cwd = tmp_path if where == "tmp" else private_dir
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "up.log").open("w+")
    # No --data-dir: `make run` relies on the default, ./.sxwl in the working directory.
    proc = subprocess.Popen(
        [sys.executable, "-m", "sxwl.cli", "up", "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **FAST, "COLUMNS": "200"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        CloudProcess.wait_for(url, proc, Path(log.name), timeout=CloudProcess.UP_READY_S)
        logins = dict(re.findall(r"│ (\S+@demo\.example\.com)\s+│ (\S+)\s+│", Path(log.name).read_text()))
        password = logins["user@demo.example.com"]
        user = sign_in(url, "user@demo.example.com", password)

        def demo_job_done() -> dict[str, Any] | None:
            (job,) = httpx.get(f"{url}/api/v1/jobs", headers=user).json()["items"]
            return job if job["state"] in ("succeeded", "failed") else None

        job = eventually(demo_job_done, timeout=180, what="the demo job to finish")
        job_id = job["id"]
        assert job["state"] == "succeeded", httpx.get(f"{url}/api/v1/jobs/{job_id}/logs", headers=user).text
        text = httpx.get(f"{url}/api/v1/jobs/{job_id}/logs", headers=user).text
        # The job was told an absolute output dir: in a sandbox the fixed one, else its attempt's,
        # under the data dir's agent state.
        (told,) = re.findall(r", output (.+)$", text, re.MULTILINE)
        attempt = (cwd / ".sxwl" / "agent" / "jobs" / f"{job_id}-1").resolve()
        assert Path(told) == (JOB_OUTPUT if detect("auto").isolated else attempt / "output")

        files = downloaded(url, job_id, user)
        assert set(files) == {"checkpoint.npz", "metrics.json"}
        metrics = json.loads(files["metrics.json"])
        assert metrics["job_id"] == job_id and metrics["steps"] == 200 and metrics["interrupted"] is False
        with np.load(io.BytesIO(files["checkpoint.npz"])) as checkpoint:
            assert {"E", "W1", "b1", "W2", "b2", "vocab", "config"} <= set(checkpoint.files)
            assert checkpoint["E"].shape[0] == len(checkpoint["vocab"]) == metrics["vocab_size"]
        # The cloud's store is the relative data dir of `sxwl up`, taken against its working directory.
        stored = cwd / ".sxwl" / "artifacts" / job_id
        assert (stored / "checkpoint.npz").read_bytes() == files["checkpoint.npz"]

        page = console_job_page(url, "user@demo.example.com", password, job_id)
        for path in ("checkpoint.npz", "metrics.json"):
            assert f'data-path="{path}"' in page
            assert f'href="/api/v1/jobs/{job_id}/artifacts/{path}"' in page
        assert '<span class="muted">(2)</span>' in page
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()


def test_relative_state_and_data_dirs_are_resolved_at_start(tmp_path: Path) -> None:
    cloud = CloudProcess(Path("cloud"), free_port(), cwd=tmp_path)
    agent: AgentProcess | None = None
    try:
        provider = Provider(cloud)
        httpx.post(
            f"{cloud.url}/api/v1/auth/register",
            json={"email": "dev@example.com", "password": "correct horse", "role": "user"},
        ).raise_for_status()
        user = sign_in(cloud.url, "dev@example.com", "correct horse")
        # Trusted, so that the job runs where this machine cannot isolate jobs too.
        args = ("--heartbeat-interval", "0.3", "--trust-account", "dev@example.com")
        agent = AgentProcess(cloud.url, Path("agent"), provider.key, *args, cwd=tmp_path)
        eventually(lambda: provider.only_cpod("online"), what="the CPod online")
        script = (
            'printf "output=%s home=%s pwd=%s\\n" "$SXWL_OUTPUT_DIR" "$HOME" "$(pwd)"; '
            'echo weights > "$SXWL_OUTPUT_DIR/model.bin"'
        )
        body = {"name": "paths", "command": script, "gpus_per_node": 0}
        response = httpx.post(f"{cloud.url}/api/v1/jobs", headers=user, json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        eventually(
            lambda: (
                httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}", headers=user).json()["state"] == "succeeded"
            ),
            timeout=60,
            what="the job to succeed",
        )
        text = httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}/logs", headers=user).text
        attempt = (tmp_path / "agent" / "jobs" / f"{job_id}-1").resolve()
        work, output = (
            (JOB_WORK, JOB_OUTPUT) if detect("auto").isolated else (attempt / "work", attempt / "output")
        )
        assert f"output={output} home={work} pwd={work}\n" in text
        assert downloaded(cloud.url, job_id, user) == {"model.bin": b"weights\n"}
        # Both processes kept their files where their working directory put them at start.
        assert (tmp_path / "agent" / "cpod.json").exists()
        assert (tmp_path / "cloud" / "sxwl.db").exists()
        assert (tmp_path / "cloud" / "artifacts" / job_id / "model.bin").read_bytes() == b"weights\n"
    finally:
        if agent is not None:
            agent.stop()
        cloud.stop()


def test_settings_make_the_data_dir_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings().data_dir == tmp_path.resolve() / ".sxwl"
    assert Settings(data_dir=Path("d")).data_dir == tmp_path.resolve() / "d"
    monkeypatch.setenv("SXWL_DATA_DIR", "e/../f")
    settings = Settings()
    assert settings.data_dir == tmp_path.resolve() / "f"
    assert settings.resolved_database_url() == f"sqlite:///{tmp_path.resolve() / 'f' / 'sxwl.db'}"
