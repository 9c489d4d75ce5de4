"""``sxwl-agent`` as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class AgentProcess:
    def __init__(
        self,
        api_url: str,
        state_dir: Path,
        access_key: str | None,
        *args: str,
        cwd: Path | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        """``cwd``: the agent's working directory, against which a relative ``state_dir`` counts;
        ``python`` runs it, with ``env`` added to this process's environment."""
        where = cwd / state_dir if cwd is not None else state_dir
        self.log_path = where.parent / f"{where.name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "SXWL_ACCESS_KEY"}
        if access_key is not None:
            env["SXWL_ACCESS_KEY"] = access_key  # never on the command line
        self.proc = subprocess.Popen(
            [python, "-m", "sxwl.agent", "--api-url", api_url, "--state-dir", str(state_dir), *args],
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float = 20) -> int:
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def simulated_agent(
    api_url: str,
    state_dir: Path,
    access_key: str,
    *extra: str,
    name: str,
    gpus: int,
    product: str,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> AgentProcess:
    """An agent with ``gpus`` simulated GPUs of ``product``, quick heartbeats and a 1 s stop grace."""
    return AgentProcess(
        api_url,
        state_dir,
        access_key,
        "--heartbeat-interval",
        "0.3",
        "--simulate-gpus",
        str(gpus),
        "--simulate-gpu-product",
        product,
        "--stop-grace",
        "1",
        "--name",
        name,
        *extra,
        python=python,
        env=env,
    )


def eventually(check: Callable[[], T | None], timeout: float = 20, what: str = "condition") -> T:
    """Polls until ``check`` returns something truthy; fails with ``what`` after ``timeout``. The
    polls start 0.05 s apart and slow to 0.25 s: most checks ask a server, whose CPU a long wait
    would otherwise spend on answering them."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.25, 0.25)
