"""What the platform adds to a fine-tune: the tiny Llama fine-tuned through the whole system (cloud,
agent, local runtime, sandbox) against the same trainer run directly on the same data, in one run.

Builds the tiny model and a sample dataset, then ``--repeat`` times each, one at a time:

- **direct**: ``python -m sxwl.trainer run.json`` on files already on disk; time from the start of
  the process to its first ``metrics`` progress line, and to its exit;
- **through the system**: a fine-tune created through ``POST /v1/fine_tuning/jobs`` on a cloud
  (SQLite) with one local agent; time from the create request to the first metrics event, and to
  ``succeeded`` (the adapter registered). This includes the scheduler's placement, the long-poll, the
  inputs' fetch (the first run; later ones hit the CPod's cache), the sandbox, the log shipped and
  read for progress, checkpoints and the adapter uploaded.

Prints the medians and the ratios system / direct, and appends a dated section to bench/RESULTS.md.
Run: ``.venv/bin/python bench/finetune.py [--repeat 3] [--examples 40] [--epochs 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
from bench.common import Processes, append_results, cloud_env, interrupt_on_sigterm, machine_line, utc_now  # noqa: E402
from tests.support.agent import AgentProcess, eventually  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402

from sxwl.protocol.finetune import ResolvedHyperparameters, TrainerRun, parse_progress  # noqa: E402

MODEL = "tiny-llama"
POLL_S = 0.05
PASSWORD = "bench-password-0123"


def _python(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [sys.executable, *args],
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def direct(root: Path, model: Path, data: Path, epochs: int, n: int) -> tuple[float, float]:
    output = root / f"direct-{n}"
    output.mkdir()
    run = TrainerRun(
        hyperparameters=ResolvedHyperparameters(n_epochs=epochs, batch_size=4, learning_rate_multiplier=1.0),
        model_dir=str(model),
        training_file=str(data),
        output_dir=str(output),
    )
    spec = root / f"run-{n}.json"
    spec.write_text(run.model_dump_json())
    start = time.monotonic()
    first = None
    env = {**os.environ, "SXWL_OUTPUT_DIR": str(output)}
    with subprocess.Popen(
        [sys.executable, "-m", "sxwl.trainer", str(spec)], stdout=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress = parse_progress(line.rstrip("\n"))
            if first is None and progress is not None and progress.kind == "metrics":
                first = time.monotonic() - start
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"the trainer failed (exit {proc.returncode})")
    return first, time.monotonic() - start


class System:
    """A cloud on SQLite with the tiny model registered, one local agent and a signed-in user."""

    def __init__(self, root: Path, model: Path, data: Path, processes: Processes) -> None:
        db = f"sqlite:///{root / 'cloud' / 'sxwl.db'}"
        (root / "cloud").mkdir(parents=True)
        env = {**cloud_env(db), "SXWL_SCHEDULER_INTERVAL_S": "0.2"}
        register = ("-m", "sxwl.cli", "admin", "register-model", "--name", MODEL, str(model))
        _python(*register, env={**env, "SXWL_DATA_DIR": str(root / "cloud")})
        self.cloud = CloudProcess(root / "cloud", free_port(), env=env)
        processes.add(self.cloud.stop)
        self.url = self.cloud.url
        provider = self._account("provider@bench.example.com", "provider")
        key = httpx.get(f"{self.url}/api/v1/me/access-key", headers=provider).json()["access_key"]
        self.user = self._account("user@bench.example.com", "user")
        agent = AgentProcess(self.url, root / "agent", key, "--heartbeat-interval", "1", "--name", "bench")
        processes.add(agent.stop)
        eventually(
            lambda: any(
                c["status"] == "online"
                for c in httpx.get(f"{self.url}/api/v1/cpods", headers=provider).json()
            ),
            what="the CPod online",
        )
        with data.open("rb") as handle:
            uploaded = httpx.post(
                f"{self.url}/v1/files",
                headers=self.user,
                files={"file": ("train.jsonl", handle)},
                data={"purpose": "fine-tune"},
            )
        uploaded.raise_for_status()
        self.file_id: str = uploaded.json()["id"]

    def _account(self, email: str, role: str) -> dict[str, str]:
        httpx.post(
            f"{self.url}/api/v1/auth/register", json={"email": email, "password": PASSWORD, "role": role}
        ).raise_for_status()
        login = httpx.post(f"{self.url}/api/v1/auth/login", json={"email": email, "password": PASSWORD})
        return {"Authorization": f"Bearer {login.json()['access_token']}"}

    def run(self, epochs: int) -> tuple[float, float]:
        body = {
            "model": MODEL,
            "training_file": self.file_id,
            "hyperparameters": {"n_epochs": epochs, "batch_size": 4},
        }
        start = time.monotonic()
        created = httpx.post(f"{self.url}/v1/fine_tuning/jobs", headers=self.user, json=body, timeout=30)
        created.raise_for_status()
        job_id = created.json()["id"]
        first = None
        while True:
            if first is None:
                events: list[dict[str, Any]] = httpx.get(
                    f"{self.url}/v1/fine_tuning/jobs/{job_id}/events",
                    headers=self.user,
                    params={"limit": 100},
                ).json()["data"]
                if any(e["type"] == "metrics" for e in events):
                    first = time.monotonic() - start
            status = httpx.get(f"{self.url}/v1/fine_tuning/jobs/{job_id}", headers=self.user).json()["status"]
            if status in ("succeeded", "failed", "cancelled"):
                if status != "succeeded" or first is None:
                    raise SystemExit(f"fine-tune {job_id} ended {status}")
                return first, time.monotonic() - start
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    processes = Processes()
    with tempfile.TemporaryDirectory(prefix="sxwl-bench-ft-") as scratch, interrupt_on_sigterm():
        root = Path(scratch)
        model, data = root / MODEL, root / "train.jsonl"
        _python("-m", "sxwl.trainer.tiny", str(model))
        _python(
            "-c",
            "import sys, pathlib; from sxwl.trainer import tiny; "
            "tiny.sample_dataset(pathlib.Path(sys.argv[1]), n=int(sys.argv[2]))",
            str(data),
            str(args.examples),
        )
        try:
            system = System(root / "system", model, data, processes)
            direct_runs = [direct(root, model, data, args.epochs, n) for n in range(args.repeat)]
            system_runs = [system.run(args.epochs) for _ in range(args.repeat)]
        finally:
            processes.stop_all()
    d_first, d_total = (statistics.median(r[i] for r in direct_runs) for i in (0, 1))
    s_first, s_total = (statistics.median(r[i] for r in system_runs) for i in (0, 1))
    steps = -(-args.examples // 4) * args.epochs
    lines = [
        f"## finetune: {utc_now()}",
        "",
        machine_line(),
        f"- the tiny Llama ({MODEL}), {args.examples} examples, {args.epochs} epochs, batch 4: {steps} steps "
        f"on CPUs; medians of {args.repeat} runs each",
        "",
        "| | first step, s | total, s |",
        "|---|---|---|",
        f"| trainer run directly | {d_first:.2f} | {d_total:.2f} |",
        f"| through the system | {s_first:.2f} | {s_total:.2f} |",
        f"| system / direct | {s_first / d_first:.2f}× | {s_total / d_total:.2f}× |",
        "",
        f"- the platform's overhead: {s_first - d_first:+.2f} s to the first step, "
        f"{s_total - d_total:+.2f} s in all",
        "",
    ]
    print("\n".join(lines))
    if not args.no_results:
        append_results("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
