"""Reading what a job wrote, with the agent's privileges, without ever leaving the attempt's tree
(docs/agent.md, "What the agent reads of a job").

The agent (root on most CPods) uploads an attempt's checkpoints while it runs and its outputs when
it ends. The job owns that tree and keeps changing it meanwhile, so every name in it is the job's to
point anywhere: a path opened the ordinary way follows a link the job put there (to the CPod token,
the input cache, ``/etc/ssh``), or one it swapped in between a listing and the open. Here every step
is taken relative to a directory descriptor with ``O_NOFOLLOW``, the file finally opened must be a
regular file owned by the attempt's uid, and the caller reads the descriptor it got, never the name
again. A link, a FIFO, a device or a file of another owner is refused as ``NotTheJobs``."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# No link followed, no blocking on a FIFO the job made, no terminal taken over.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
CHUNK = 1024 * 1024


class NotTheJobs(OSError):
    """A name in the attempt's tree that is not a regular file of the attempt's own (a link, say)."""


@dataclass(frozen=True)
class OutputTree:
    """An attempt's output dir. ``path`` was made by the agent below its own dirs, so only what is
    inside it is the job's; ``owner`` is the uid the job's files belong to."""

    path: Path
    owner: int

    def files(self, below: str | None = None, *, recursive: bool = True) -> list[str]:
        """The POSIX paths, relative to the tree, of the regular files below ``below`` (a dir in the
        tree; None: the whole tree), in order. Nothing is followed: a link to a dir is not entered
        and a link to a file is not listed. Names starting with a dot are left out only at the top
        of ``below`` when not recursive (the trainer's checkpoints in progress)."""
        found: list[str] = []
        try:
            top = self._open_dir(below)
        except OSError:
            return found
        try:
            base = PurePosixPath(below) if below else PurePosixPath()
            for where, _dirs, names, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                for name in names:
                    if not recursive and name.startswith("."):
                        continue
                    try:
                        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(info.st_mode) and info.st_uid == self.owner:
                        found.append((base / PurePosixPath(where) / name).as_posix())
                if not recursive:
                    break
        finally:
            os.close(top)
        return sorted(found)

    def open(self, relative: str) -> OutputFile:
        """The file at ``relative``, opened without following any link at any step; raises
        ``NotTheJobs`` unless it is a regular file of the attempt's uid, FileNotFoundError when it
        is gone."""
        parts = PurePosixPath(relative).parts
        if not parts or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise NotTheJobs(f"{relative}: not a path inside the attempt's outputs")
        parent = self._open_dir("/".join(parts[:-1]) or None)
        try:
            fd = _open_or_refuse(parts[-1], parent, relative, _FILE_FLAGS)
        finally:
            os.close(parent)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != self.owner:
            os.close(fd)
            raise NotTheJobs(f"{relative}: not a regular file of the job's own")
        return OutputFile(fd, info.st_size)

    def _open_dir(self, relative: str | None) -> int:
        """A descriptor of the tree's root or of a dir in it, each step taken without links."""
        fd = os.open(self.path, _DIR_FLAGS)
        for part in PurePosixPath(relative).parts if relative else ():
            try:
                step = _open_or_refuse(part, fd, relative or "", _DIR_FLAGS)
            finally:
                os.close(fd)
            fd = step
        return fd


def _open_or_refuse(name: str, dir_fd: int, relative: str, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP: a link where O_NOFOLLOW met it; ENOTDIR: a link (or file) where a dir was expected.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotTheJobs(f"{relative}: a link or not a directory, not read") from None
        raise


class OutputFile:
    """An open file of the attempt's, read by position: hashing it and sending it read the same
    open file, whatever the job renames meanwhile. ``size`` is what it had when opened."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def chunks(self) -> Iterator[bytes]:
        """The bytes from the start, at most ``size`` of them (a file still growing is cut there)."""
        offset = 0
        while offset < self.size:
            chunk = os.pread(self.fd, min(CHUNK, self.size - offset), offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
