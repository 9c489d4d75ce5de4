"""The CPod's input cache (docs/agent.md, "Inputs and the cache"): what fine-tunes fetch from the
cloud (a base model, a training file, a checkpoint), kept under the state dir by sha256 so that the
next attempt needing the same bytes finds them here, and the cloud can prefer this CPod for it.

Layout under ``root``: ``<sha256>`` a verified file, ``<sha256>.d/`` an unpacked archive, both
read-only (0444 files, 0555 dirs: attempts get hard links of them, never a writable copy);
``.tmp/`` downloads and unpacks in progress; ``.pending/`` one marker per attempt whose inputs are
being fetched, so that a restarted agent reports such an attempt lost instead of leaving it
``starting`` on the cloud forever.

On a Kubernetes CPod (``unpack_archives=False``) every entry stays the file the cloud sent: the
agent serves it to the attempt's pods (cache_server.py), whose fetcher unpacks it in the pod.

An entry counts what it holds on disk: a file's size, an unpacked tree's files' sizes (never the
archive's, which a compressed tree is a sliver of). An archive is judged by its headers before any
of it is unpacked: more than ``MAX_MEMBERS`` entries, or files adding up to more than the
assignment's ``archive_max_bytes`` (the cloud's model limit), and it is refused, nothing written.

With a size cap, a fetch first makes room by removing the least recently used entries (an entry's
mtime is touched each time an attempt takes it), for the download and again, from the headers, for
what an archive will unpack to. Removing one never harms a running attempt, whose inputs are hard
links of their own; entries taken in the last ``RECENT_S`` are kept, so an attempt between its
fetch and its start never loses what it fetched."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import stat
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sxwl.agent.client import CloudClient
from sxwl.protocol.finetune import CachedInput, JobInput

READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555
RECENT_S = 600.0
MAX_MEMBERS = 100_000  # entries of one archive: ten times what the cloud takes in a model


class InputError(Exception):
    """An input that arrived wrong (its sha256 or size) or cannot be unpacked."""


def unpacks(item: JobInput) -> bool:
    """Whether the attempt gets the archive's tree rather than the file. The ``resume`` checkpoint
    stays a tar: the trainer takes ``resume_from`` as the tar it wrote and unpacks it itself."""
    return item.archive and item.name != "resume"


@dataclass(frozen=True)
class Pending:
    job_id: str
    attempt: int


class InputCache:
    def __init__(
        self,
        root: Path,
        client: CloudClient,
        max_bytes: int | None = None,
        *,
        unpack_archives: bool = True,
    ) -> None:
        self.root = root
        self.client = client
        self.max_bytes = max_bytes  # None: no cap
        self.unpack_archives = unpack_archives
        self._locks: dict[str, asyncio.Lock] = {}
        self._sizes: dict[str, int] | None = None  # sha256 -> bytes held, read from disk once

    # ---- fetching --------------------------------------------------------------------------------

    async def fetch(
        self, token: str, job_id: str, attempt: int, item: JobInput, max_unpacked: int | None = None
    ) -> Path:
        """The cached path of ``item`` (a file, or the unpacked tree of an archive), downloaded once:
        concurrent attempts needing the same sha256 wait for the first one's download. An archive
        whose files add up to more than ``max_unpacked`` bytes is refused before it is unpacked."""
        lock = self._locks.setdefault(item.sha256, asyncio.Lock())
        async with lock:
            unpack = self.unpack_archives and unpacks(item)
            final = self._tree(item.sha256) if unpack else self._file(item.sha256)
            if final.exists():
                await asyncio.to_thread(_touch, final)
                return final
            await asyncio.to_thread(self._ensure_dirs)
            await asyncio.to_thread(self._make_room, item.size)
            temp = self.root / ".tmp" / f"{item.sha256}.{uuid.uuid4().hex}"
            try:
                size, digest = await self.client.fetch_input(token, job_id, attempt, item.name, temp)
                if digest != item.sha256 or size != item.size:
                    raise InputError(
                        f"input {item.name}: got {size} bytes with sha256 {digest}, "
                        f"expected {item.size} bytes with sha256 {item.sha256}"
                    )
                held = item.size
                if unpack:
                    held = await asyncio.to_thread(self._unpack, item, temp, final, max_unpacked)
                else:
                    os.chmod(temp, READ_ONLY_FILE)
                    os.replace(temp, final)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()
            self._remember(item.sha256, held)
            return final

    def _unpack(self, item: JobInput, tar: Path, final: Path, max_unpacked: int | None) -> int:
        """Unpacks ``tar`` into ``final``; returns the bytes its files hold there."""
        staging = tar.with_name(tar.name + ".d")
        try:
            with tarfile.open(tar) as archive:
                members, unpacked = _headers(archive, max_unpacked)
                self._make_room(unpacked)
                archive.extractall(staging, members=members, filter=_members_filter)  # noqa: S202 - the filter checks each member
        except (OSError, tarfile.TarError) as exc:
            if staging.exists():
                writable_tree(staging)
                shutil.rmtree(staging, ignore_errors=True)
            raise InputError(f"input {item.name}: cannot unpack the archive: {exc}") from None
        read_only_tree(staging)
        os.replace(staging, final)
        return held_bytes(final)

    def _make_room(self, incoming: int) -> None:
        """Removes the least recently taken entries until ``incoming`` more bytes fit under the cap
        (or only entries taken in the last ``RECENT_S``, or being fetched, are left)."""
        if self.max_bytes is None:
            return
        if self._sizes is None:
            self._sizes = self._scan()
        held = sum(self._sizes.values())
        now = time.time()
        by_age = sorted((self._last_taken(sha), sha) for sha in self._sizes)
        for taken, sha in by_age:
            if held + incoming <= self.max_bytes:
                return
            busy = self._locks.get(sha)
            if now - taken < RECENT_S or (busy is not None and busy.locked()):
                continue
            for entry in (self._file(sha), self._tree(sha)):
                if entry.is_dir():
                    writable_tree(entry)
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            held -= self._sizes.pop(sha)

    def _last_taken(self, sha256: str) -> float:
        for entry in (self._file(sha256), self._tree(sha256)):
            with contextlib.suppress(FileNotFoundError):
                return entry.stat().st_mtime
        return 0.0

    def held_file(self, sha256: str) -> Path | None:
        """The cached file of ``sha256``, marked as just taken; None when it is not (or no longer)
        here as a file."""
        path = self._file(sha256)
        try:
            _touch(path)
        except FileNotFoundError:
            return None
        return path if path.is_file() else None

    # ---- what the heartbeat reports -------------------------------------------------------------

    def entries(self) -> list[CachedInput]:
        if self._sizes is None:
            self._sizes = self._scan()
        return [CachedInput(sha256=sha, size=size) for sha, size in sorted(self._sizes.items())]

    def _remember(self, sha256: str, size: int) -> None:
        if self._sizes is None:
            self._sizes = self._scan()
        self._sizes[sha256] = size

    def _scan(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        if not self.root.is_dir():
            return sizes
        for entry in self.root.iterdir():
            sha = entry.name.removesuffix(".d")
            if entry.name.startswith(".") or len(sha) != 64:
                continue
            sizes[sha] = max(sizes.get(sha, 0), held_bytes(entry))
        return sizes

    # ---- attempts being prepared ----------------------------------------------------------------

    def mark_pending(self, job_id: str, attempt: int) -> None:
        self._ensure_dirs()
        (self.root / ".pending" / f"{job_id}-{attempt}").touch()

    def clear_pending(self, job_id: str, attempt: int) -> None:
        (self.root / ".pending" / f"{job_id}-{attempt}").unlink(missing_ok=True)

    def left_pending(self) -> list[Pending]:
        """Attempts a previous run of the agent was still fetching inputs for."""
        found: list[Pending] = []
        directory = self.root / ".pending"
        for marker in sorted(directory.iterdir()) if directory.is_dir() else []:
            job_id, _, attempt = marker.name.rpartition("-")
            if job_id and attempt.isdigit():
                found.append(Pending(job_id, int(attempt)))
        return found

    # ---- layout ---------------------------------------------------------------------------------

    def _file(self, sha256: str) -> Path:
        return self.root / sha256

    def _tree(self, sha256: str) -> Path:
        return self.root / f"{sha256}.d"

    def _ensure_dirs(self) -> None:
        for directory in (self.root, self.root / ".tmp", self.root / ".pending"):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def _touch(entry: Path) -> None:
    """Marks the entry as just taken, for the cache's eviction order."""
    os.utime(entry)


def held_bytes(entry: Path) -> int:
    """What a cache entry holds on disk: a file's size, or the sizes of a tree's files."""
    if not entry.is_dir():
        return entry.stat().st_size
    return sum(f.stat().st_size for f in entry.rglob("*") if f.is_file() and not f.is_symlink())


class ArchiveTooLarge(tarfile.TarError):
    """An archive refused from its headers, before anything of it is unpacked."""


def _headers(archive: tarfile.TarFile, limit: int | None) -> tuple[list[tarfile.TarInfo], int]:
    """Every member's header (no file's bytes), and the bytes its files add up to: an archive of a
    few megabytes can unpack to gigabytes, so this is judged before a byte is written."""
    members: list[tarfile.TarInfo] = []
    unpacked = 0
    while (member := archive.next()) is not None:
        if len(members) == MAX_MEMBERS:
            raise ArchiveTooLarge(f"more than {MAX_MEMBERS} entries; refused before unpacking")
        if member.isreg():
            unpacked += member.size
            if limit is not None and unpacked > limit:
                raise ArchiveTooLarge(
                    f"its files add up to more than the model limit ({limit} bytes); refused before unpacking"
                )
        members.append(member)
    return members, unpacked


def _members_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """Python's "data" filter (no absolute paths or ``..`` leaving the tree, no devices, no setuid
    bits), and no links at all: a model or dataset needs none, and a hard-linked tree handed to
    attempts must not point anywhere."""
    if member.issym() or member.islnk():
        raise tarfile.FilterError(f"{member.name!r} is a link")
    if member.name.startswith("/"):  # "data" would make it relative; an archive like that is wrong
        raise tarfile.FilterError(f"{member.name!r} is an absolute path")
    return tarfile.data_filter(member, dest)


def read_only_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # children first: a 0555 dir stays walkable
        if not path.is_symlink():
            os.chmod(path, READ_ONLY_DIR if path.is_dir() else READ_ONLY_FILE)
    os.chmod(root, READ_ONLY_DIR)


def writable_tree(root: Path) -> None:
    """Makes the dirs below ``root`` writable again so it can be removed (files keep their modes:
    they may be hard links of the cache's). The tree may be a job's: each dir is changed through
    the descriptor that ``fwalk`` opened without following links, so a link swapped in for a dir
    never has root change the mode of what it points to."""
    try:
        for _where, _dirs, _files, dir_fd in os.fwalk(root, follow_symlinks=False):
            os.fchmod(dir_fd, stat.S_IMODE(os.fstat(dir_fd).st_mode) | stat.S_IRWXU)
    except FileNotFoundError:  # the top is gone already: nothing to make writable
        return


def materialise(source: Path, dest: Path) -> None:
    """``dest`` as the attempt's own entry for a cached file or tree: hard links of the cached files
    (no bytes copied), or copies where the attempt's dir is on another file system. Read-only."""
    if source.is_dir():
        dest.mkdir(mode=0o755)
        for child in sorted(source.iterdir()):
            materialise(child, dest / child.name)
        os.chmod(dest, READ_ONLY_DIR)
        return
    try:
        os.link(source, dest)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(source, dest)
        os.chmod(dest, READ_ONLY_FILE)
