"""What every part of the build reports: a file it could not make (and why), and progress lines
with the time each part took."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True)
class Missing:
    """A file the manifest names that this build could not make: recorded under ``build.missing``,
    which makes the artifact PARTIAL (``3kctl artifact verify`` says so and exits 3)."""

    path: str
    reason: str


@dataclass
class Progress:
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    timings: dict[str, float] = field(default_factory=dict)

    def say(self, line: str) -> None:
        self.stream.write(f"[artifact] {line}\n")
        self.stream.flush()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        self.say(f"{name} ...")
        start = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.timings[name] = took
            self.say(f"{name}: {took:.1f}s")
