"""Settings and processes for a cloud under test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from sxwl.cloud.config import Settings

# Cheap argon2 keeps the suite fast; production parameters are measured in bench/.
FAST_HASHING = {"argon2_time_cost": 1, "argon2_memory_kib": 1024}


# What the tests' clouds take as the Prometheus scraper's token (SXWL_METRICS_TOKEN).
METRICS_TOKEN = "test-metrics-token"
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}


def test_settings(data_dir: Path, database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "secret_key": "test-secret-key-0123456789abcdef",
        "metrics_token": METRICS_TOKEN,
        # Tests of scheduling and runtimes run free; tests of money turn billing on (tests/billing.py).
        "billing_enabled": False,
        **FAST_HASHING,
        **overrides,
    }
    return Settings.model_validate(values)


class CloudProcess:
    """``sxwl serve`` as a real process on loopback."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``cwd``: the server's working directory, against which a relative ``data_dir`` counts;
        ``host``: the address it listens on (loopback unless pods must reach it)."""
        self.url = f"http://{host}:{port}"
        where = cwd / data_dir if cwd is not None else data_dir
        self.log_path = where / "cloud.log"
        where.mkdir(parents=True, exist_ok=True)
        full_env = {
            **os.environ,
            "SXWL_ARGON2_TIME_COST": "1",
            "SXWL_ARGON2_MEMORY_KIB": "1024",
            "SXWL_BILLING_ENABLED": "false",
            "SXWL_METRICS_TOKEN": METRICS_TOKEN,
            **(env or {}),
        }
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sxwl.cli",
                "serve",
                "--host",
                host,
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
            ],
            env=full_env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()  # a start that fails (or is interrupted) leaves no process behind
            raise

    def wait_ready(self) -> None:
        self.wait_for(self.url, self.proc, self.log_path)

    # `sxwl up` builds the demo's tiny model with transformers before it serves: past 30 s on a busy
    # 2-core machine.
    UP_READY_S = 180

    @staticmethod
    def wait_for(url: str, proc: subprocess.Popen[Any], log_path: Path, timeout: float = 90) -> None:
        """Waits until ``/healthz`` answers; fails with the process's log if it dies or never does. A
        cloud's start took 30 s on the 2-core machine while the real nodes imported an image."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"cloud exited early:\n{log_path.read_text()}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"cloud not ready after {timeout}s:\n{log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


class Provider:
    """A provider account on a cloud process, signed in, with its accessKey."""

    def __init__(self, cloud: CloudProcess, email: str = "owner@example.com") -> None:
        self.url = cloud.url
        httpx.post(
            f"{self.url}/api/v1/auth/register",
            json={"email": email, "password": "correct horse", "role": "provider"},
        ).raise_for_status()
        token = httpx.post(
            f"{self.url}/api/v1/auth/login", json={"email": email, "password": "correct horse"}
        ).json()["access_token"]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.key: str = httpx.get(f"{self.url}/api/v1/me/access-key", headers=self.headers).json()[
            "access_key"
        ]

    def cpods(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = httpx.get(f"{self.url}/api/v1/cpods", headers=self.headers).json()
        return result

    def only_cpod(self, status: str | None = None) -> dict[str, Any] | None:
        cpods = self.cpods()
        if len(cpods) == 1 and (status is None or cpods[0]["status"] == status):
            return cpods[0]
        return None
