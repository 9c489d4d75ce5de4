"""What `sxwl serve` prints: short lines on a terminal, JSON lines in a file, the flag deciding."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.cloud import CloudProcess
from tests.support.net import free_port


@contextmanager
def serve_on_terminal(data_dir: Path, *flags: str) -> Iterator[tuple[str, list[bytes]]]:
    """`sxwl serve` with standard error on a pseudo-terminal; yields its URL and what it printed."""
    port = free_port()
    leader, follower = pty.openpty()
    env = {**os.environ, "SXWL_ARGON2_TIME_COST": "1", "SXWL_ARGON2_MEMORY_KIB": "1024"}
    env.pop("SXWL_LOG_FORMAT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sxwl.cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *flags],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    printed: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closes with the process
                return
            if not chunk:
                return
            printed.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        CloudProcess.wait_for(url, proc, Path(os.devnull))
        yield url, printed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
        reader.join(5)
        os.close(leader)


def lines(printed: list[bytes]) -> list[str]:
    return [line.strip() for line in b"".join(printed).decode().splitlines() if line.strip()]


def test_a_terminal_gets_short_lines_and_only_what_went_wrong(tmp_path: Path) -> None:
    with serve_on_terminal(tmp_path / "data") as (url, printed):
        for _ in range(5):
            assert httpx.get(url + "/healthz").status_code == 200
        assert httpx.get(url + "/login").status_code == 200
        assert httpx.get(url + "/api/v1/no-such-thing").status_code == 404
    output = lines(printed)
    assert not any(line.startswith("{") for line in output), output
    assert any("Uvicorn running" in line for line in output), output
    assert any("GET /api/v1/no-such-thing 404" in line for line in output), output
    # Requests that went well are not printed.
    assert not any("/login" in line or "/healthz" in line for line in output), output
    level = next(line for line in output if "no-such-thing" in line).split()[1]
    assert level == "INFO"


def test_json_lines_when_asked_even_on_a_terminal(tmp_path: Path) -> None:
    with serve_on_terminal(tmp_path / "data", "--log-format", "json") as (url, printed):
        assert httpx.get(url + "/login").status_code == 200
    entries = [json.loads(line) for line in lines(printed) if line.startswith("{")]
    assert any(e.get("path") == "/login" and e.get("status") == 200 for e in entries), entries


def test_json_lines_when_standard_error_is_a_file(tmp_path: Path) -> None:
    cloud = CloudProcess(tmp_path / "data", free_port())
    try:
        assert httpx.get(cloud.url + "/login").status_code == 200
    finally:
        cloud.stop()
    entries = [json.loads(line) for line in cloud.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("path") == "/login" and e.get("status") == 200 for e in entries), entries


def test_a_bad_log_format_is_refused_naming_the_flag(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sxwl.cli", "serve", "--data-dir", str(tmp_path), "--log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--log-format" in result.stderr
