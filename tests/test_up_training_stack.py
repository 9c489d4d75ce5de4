"""`sxwl up` keeps the training stack out of the cloud's process: after a demo fine-tune ran to its
end (the real agent, the real trainer on CPUs), the `sxwl up` process has mapped no torch or triton
library, and Ctrl-C stops it without the stack's "nanobind: leaked …" lines on exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sxwl.cli.demo_finetune import DEMO_DATASET, DEMO_MODEL
from sxwl.cli.server import DEMO_USER
from tests.support.agent import eventually
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytest.importorskip("peft", reason="the demo fine-tune needs the training extra: pip install -e '.[train]'")

RUN_S = 420  # the model's load, the steps of one epoch and the adapter, on a busy CPU


def test_the_cloud_process_never_loads_the_training_stack(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SXWL_ARGON2_TIME_COST": "1", "SXWL_ARGON2_MEMORY_KIB": "1024", "COLUMNS": "200"}
    log_path = tmp_path / "up.log"
    with log_path.open("w+") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sxwl.cli",
                "up",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "data"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            CloudProcess.wait_for(url, proc, log_path, timeout=CloudProcess.UP_READY_S)
            logins = dict(
                re.findall(r"│ \w+\s+│ (\S+@demo\.example\.com)\s+│ (\S+)\s+│", log_path.read_text())
            )
            token = httpx.post(
                f"{url}/api/v1/auth/login", json={"email": DEMO_USER, "password": logins[DEMO_USER]}
            ).json()["access_token"]
            user = {"Authorization": f"Bearer {token}"}
            files = httpx.get(f"{url}/v1/files", headers=user).json()["data"]
            (dataset,) = [f["id"] for f in files if f["filename"] == DEMO_DATASET]
            body = {"model": DEMO_MODEL, "training_file": dataset, "hyperparameters": {"n_epochs": 1}}
            created = httpx.post(f"{url}/v1/fine_tuning/jobs", headers=user, json=body)
            assert created.status_code == 200, created.text

            def ended() -> str | None:
                status = httpx.get(f"{url}/v1/fine_tuning/jobs/{created.json()['id']}", headers=user).json()
                return (
                    str(status["status"])
                    if status["status"] in ("succeeded", "failed", "cancelled")
                    else None
                )

            assert eventually(ended, timeout=RUN_S, what="the demo fine-tune to end") == "succeeded"
            mapped = Path(f"/proc/{proc.pid}/maps").read_text()
            assert "torch" not in mapped and "triton" not in mapped
        finally:
            # Ctrl-C at the terminal: SIGINT to `sxwl up` (its agent runs in a session of its own).
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
    said = log_path.read_text()
    assert proc.returncode in (0, 130), said  # 130: stopped by SIGINT, as a shell reports it
    assert "nanobind" not in said and "leaked" not in said, said
