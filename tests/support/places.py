"""Places an agent's state dir may be in that a job's own uid cannot reach by path: below a dir only
its owner may search (mode 0700, as root's home and every ``mktemp -d`` are), with spaces in its
name. Not below /tmp, which a job's sandbox replaces with a tmpfs of its own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sxwl.agent.inputs import writable_tree


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """An empty dir named with spaces, below a 0700 dir of /var/tmp; removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="sxwl-test-", dir="/var/tmp"))
    assert top.stat().st_mode & 0o777 == 0o700
    inside = top / "a dir with spaces"
    inside.mkdir()
    try:
        yield inside
    finally:
        writable_tree(top)  # an attempt's read-only inputs, left by a test that failed
        shutil.rmtree(top)
