"""Helpers shared by the benchmark scripts in bench/.

The scripts run as ``.venv/bin/python bench/X.py``: each puts the repository root on ``sys.path``
first, then imports this module as ``bench.common``.
"""

from __future__ import annotations

import datetime
import os
import platform
import signal
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
API = "/api/v1"
PASSWORD = "bench-password-0123"
GENEROUS_RATE = "1000000/1"
SECRET_KEY = "bench-secret-key-0123456789abcdef"


def cloud_env(database_url: str, log_level: str = "WARNING") -> dict[str, str]:
    """The environment of a benchmarked ``sxwl serve``: the given database, rate limits out of the way."""
    return {
        "SXWL_RATE_LOGIN_IP": GENEROUS_RATE,
        "SXWL_RATE_LOGIN_ACCOUNT": GENEROUS_RATE,
        "SXWL_RATE_REGISTER_IP": GENEROUS_RATE,
        "SXWL_RATE_REGISTER_ACCOUNT": GENEROUS_RATE,
        "SXWL_DATABASE_URL": database_url,
        "SXWL_LOG_LEVEL": log_level,
        "SXWL_SECRET_KEY": SECRET_KEY,
    }


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1 to 99) of ``values``; NaN when there are none."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Processes:
    """Everything this script started, stopped in reverse order whatever happens."""

    def __init__(self) -> None:
        self._stops: list[Callable[[], None]] = []

    def add(self, stop: Callable[[], None]) -> None:
        self._stops.append(stop)

    def stop_all(self) -> None:
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                print(f"warning: cleanup failed: {exc!r}", file=sys.stderr)


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Turns SIGTERM into ``KeyboardInterrupt`` so that ``finally`` blocks stop what was started."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_line() -> str:
    """The ``- machine: …`` line of a results section."""
    return f"- machine: {os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}"


def utc_now() -> str:
    """The time stamp of a results section's heading."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def append_results(section: str, header: str = "") -> None:
    """Appends ``section`` to bench/RESULTS.md, a blank line apart from what is there; a new file
    starts with ``header``."""
    if header and not RESULTS.exists():
        RESULTS.write_text(header)
    existing = RESULTS.read_text() if RESULTS.exists() else ""
    separator = (
        "" if not existing or existing.endswith("\n\n") else ("\n" if existing.endswith("\n") else "\n\n")
    )
    with RESULTS.open("a") as handle:
        handle.write(separator + section)
