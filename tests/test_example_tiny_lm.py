"""examples/tiny-lm: the training job the demo runs. It really trains (the loss falls), writes its
checkpoint and metrics where the agent collects artifacts, stops cleanly on SIGTERM, and its job
file is a valid JobIn whose command works from a scratch directory, as the local runtime runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sxwl.protocol.jobs import JobIn

pytest.importorskip("numpy", reason="examples/tiny-lm needs numpy: pip install -e '.[examples]'")
import numpy as np

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-lm"
STEP = re.compile(r"^step (\d+) loss (\d+\.\d+)$", re.MULTILINE)


def job_env(output: Path, **extra: str) -> dict[str, str]:
    """What the local runtime gives a job: a small inherited environment plus the sxwl variables."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    env.update(
        SXWL_JOB_ID="j-test",
        SXWL_ATTEMPT="1",
        SXWL_OUTPUT_DIR=str(output),
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def losses(log: str) -> list[tuple[int, float]]:
    return [(int(step), float(loss)) for step, loss in STEP.findall(log)]


def test_trains_and_writes_checkpoint_and_metrics(tmp_path: Path) -> None:
    output = tmp_path / "output"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), "--steps", "40", "--seed", "7", "--backend", "numpy"],
        cwd=tmp_path,
        env=job_env(output),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = losses(done.stdout)
    assert [s for s, _ in steps] == list(range(1, 41))
    first, last = [loss for _, loss in steps[:5]], [loss for _, loss in steps[-5:]]
    assert sum(last) / 5 < sum(first) / 5 - 0.5, steps  # it learns, not just wobbles
    assert "sample:" in done.stdout

    metrics: dict[str, Any] = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == 40
    assert metrics["backend"] == "numpy"
    assert metrics["final_loss"] == pytest.approx(steps[-1][1], abs=1e-3)
    assert metrics["final_loss"] < metrics["first_loss"]
    assert metrics["tokens_per_s"] > 0
    assert metrics["job_id"] == "j-test"
    assert metrics["interrupted"] is False

    with np.load(output / "checkpoint.npz") as checkpoint:
        assert {"E", "W1", "b1", "W2", "b2", "vocab", "config"} <= set(checkpoint.files)
        assert checkpoint["E"].shape[0] == len(checkpoint["vocab"]) == metrics["vocab_size"]


def test_same_seed_same_losses(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE / "train.py"), "--steps", "5", "--sample-chars", "0"],
            cwd=tmp_path,
            env=job_env(tmp_path / name, TINY_LM_SEED="3", TINY_LM_BACKEND="numpy"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        runs.append(losses(done.stdout))
    assert runs[0] == runs[1] and len(runs[0]) == 5


def test_sigterm_stops_after_the_step_and_still_writes_results(tmp_path: Path) -> None:
    output = tmp_path / "output"
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "train.py"), "--steps", "100000", "--backend", "numpy"],
        cwd=tmp_path,
        env=job_env(output),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        deadline = time.monotonic() + 120
        while not STEP.search(seen) and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        assert STEP.search(seen), seen
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "SIGTERM received" in rest
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["interrupted"] is True
    assert 1 <= metrics["steps"] < 100000
    assert (output / "checkpoint.npz").exists()


def test_job_file_is_a_valid_job_and_its_command_runs_from_a_scratch_dir(tmp_path: Path) -> None:
    spec = JobIn.model_validate(yaml.safe_load((EXAMPLE / "job.yaml").read_text()))
    assert spec.name == "tiny-lm"
    assert isinstance(spec.command, str)  # a shell string: the local runtime runs it with /bin/sh -c
    scratch, output = tmp_path / "work", tmp_path / "output"
    scratch.mkdir()

    def run(**extra: str) -> subprocess.CompletedProcess[str]:
        env = job_env(output, **spec.env, **extra)
        env["TINY_LM_STEPS"] = "3"
        assert isinstance(spec.command, str)
        return subprocess.run(
            ["/bin/sh", "-c", spec.command], cwd=scratch, env=env, capture_output=True, text=True, timeout=120
        )

    missing = run()
    assert missing.returncode != 0
    assert "TINY_LM_DIR" in missing.stderr  # says what to set, instead of a bare "file not found"

    done = run(TINY_LM_DIR=str(EXAMPLE), TINY_LM_PYTHON=sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [s for s, _ in losses(done.stdout)] == [1, 2, 3]
    assert json.loads((output / "metrics.json").read_text())["steps"] == 3
    assert {p.name for p in output.iterdir()} == {"checkpoint.npz", "metrics.json"}
