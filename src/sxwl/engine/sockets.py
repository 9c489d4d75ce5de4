"""Unix socket paths longer than the kernel's limit (108 bytes, less than a deep state dir needs):
reached through ``/proc/self/fd/N/``, N a descriptor of the socket's directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_LIMIT = 100


@contextlib.contextmanager
def reachable(path: str) -> Iterator[str]:
    """A path to ``path`` short enough to bind or connect to, valid inside the block."""
    if len(os.fsencode(path)) < _LIMIT:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
