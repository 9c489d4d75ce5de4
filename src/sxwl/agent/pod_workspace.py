"""The main program of a dev environment's pod on Kubernetes (kube_devenv.py; docs/dev-envs.md, "On
Kubernetes"): ``python3 pod_workspace.py COMMAND...``, under the wrapper of kube_wrapper.py, with
JupyterLab as COMMAND. It restores the workspace another CPod saved, runs the command, and saves the
workspace as the attempt's ``workspace.tar`` once the command has ended, for the ``uploader``
container to send to the artifact store with the attempt's other outputs.

- **Restore**, before the command starts: when the attempt has the ``workspace`` input
  (SXWL_WORKSPACE_SAVED, the tree the ``inputs`` init container unpacked from the saved tar, its
  members checked there: regular files and directories only, no absolute names, none with ``..``)
  and the claim holds nothing of the user's (a new claim: a resume on another CPod), the tree is
  copied in, again only its directories and regular files, through no link. The copy goes to a
  staging directory of the claim, renamed when complete, whose entries are then moved into place:
  a pod killed half-way leaves a complete copy, whose moves the next start finishes, or a half one,
  which the next start makes again if it is given the saved copy, and otherwise keeps as the mark
  of a claim that must not be saved (``restore``). A claim with the user's files (a resume on the
  same CPod) is left as it is.
- **Save**, once the command has ended (SIGTERM from a pause or a stop, passed on to it, or its
  own exit): the workspace without what each attempt is given afresh (``GIVEN``), directories and
  regular files only, as a tar written beside the output and renamed into it when whole, so the
  uploader never sends half of one. Nothing is saved over SXWL_WORKSPACE_MAX_BYTES (the largest
  artifact the cloud takes), nor when a restore did not finish (that would replace the whole copy
  with part of it): the workspace then stays on this CPod's claim only, and a line says why.

It runs on the environment's image, which may be any with a ``python3`` and JupyterLab, so it is the
standard library only and imports nothing of sxwl; it runs as the pod's user, who owns the claim.
Its exit status is the command's."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from types import FrameType
from typing import BinaryIO

# The same as sxwl.agent.runtimes.jupyter and sxwl.protocol.devenvs (tests check it).
WORKSPACE_TAR = "workspace.tar"
GIVEN = ("inputs", ".sxwl-dev")
LOST_FOUND = "lost+found"  # a file system's own, on a block volume: root's, not the user's work
STAGING = ".sxwl-restore"  # a complete copy, whose entries are still to move into place
PARTIAL = ".sxwl-restore.partial"  # a copy being made: thrown away when found
NOT_WORK = (*GIVEN, LOST_FOUND, STAGING, PARTIAL)
RESTORED, KEPT, UNFINISHED = "restored", "kept", "unfinished"  # what ``restore`` found and did
CHUNK = 1024 * 1024
KEPT = "; kept on this CPod only"


class Stopped(Exception):
    """SIGTERM came during the restore: the workspace is not whole, so it is not saved either."""


class Session:
    """The signals of one run: SIGTERM (and SIGINT, SIGHUP) passed on to the command as SIGTERM
    once it runs; before, it stops the restore."""

    def __init__(self) -> None:
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def check(self) -> None:
        if self.stopping:
            raise Stopped


def user_entries(work: Path) -> list[str]:
    """The names in the claim's root that are the user's work."""
    return sorted(name for name in os.listdir(work) if name not in NOT_WORK)


def restore(work: Path, saved: Path | None, session: Session) -> str:
    """Puts the saved tree into a new claim: ``RESTORED``, or ``KEPT`` (nothing to restore, or a
    claim with the user's files), or ``UNFINISHED``. A copy left complete by a pod killed during its
    moves is finished first. One left half-made is made again when this attempt has the saved copy
    and the claim nothing else; otherwise (a resume on the same CPod, which is given no copy) the
    half-copy stays as the mark of a claim that is not the user's whole workspace: ``UNFINISHED``,
    never saved over the whole one in the store."""
    if (work / STAGING).is_dir():
        _move_into_place(work)
        return RESTORED
    given = saved is not None and saved.is_dir()
    if (work / PARTIAL).exists() and (not given or user_entries(work)):
        return UNFINISHED
    _remove(work / PARTIAL)
    if saved is None or not given or user_entries(work):
        return KEPT
    partial = work / PARTIAL
    partial.mkdir(mode=0o700)
    _copy_tree(saved, partial, session)
    partial.rename(work / STAGING)
    _move_into_place(work)
    return RESTORED


def _copy_tree(source: Path, target: Path, session: Session) -> None:
    """Directories and regular files of ``source`` into the existing ``target``; nothing else, and
    no name through a link. The copies are the user's to change: directories 0700, files 0600 (the
    fetcher left the saved tree read-only, and the tar's modes were not kept)."""
    for where, dirs, files in os.walk(source):
        here = Path(where)
        into = target / here.relative_to(source)
        kept_dirs = []
        for name in sorted(dirs):
            if stat.S_ISDIR((here / name).lstat().st_mode):
                (into / name).mkdir(mode=0o700)
                kept_dirs.append(name)
        dirs[:] = kept_dirs  # os.walk goes only into these (never through a link)
        for name in sorted(files):
            session.check()
            if not stat.S_ISREG((here / name).lstat().st_mode):
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with (
                _open_regular(here / name) as src,
                os.fdopen(os.open(into / name, flags, 0o600), "wb") as out,
            ):
                shutil.copyfileobj(src, out, CHUNK)


def _move_into_place(work: Path) -> None:
    staging = work / STAGING
    for name in sorted(os.listdir(staging)):
        os.replace(staging / name, work / name)
    staging.rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is still a regular file, never through a link at its end."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is no longer a regular file")
    return os.fdopen(fd, "rb")


def saved_entries(work: Path) -> tuple[list[Path], int, list[str]]:
    """(what the tar holds, the bytes of its files, what could not be read): the claim's directories
    and regular files, not what each attempt is given, nothing through a link."""
    entries: list[Path] = []
    skipped: list[str] = []
    total = 0

    def unreadable(error: OSError) -> None:
        skipped.append(f"{error.filename}: {error.strerror}")

    for where, dirs, files in os.walk(work, onerror=unreadable):
        here = Path(where)
        if here == work:
            dirs[:] = [name for name in dirs if name not in NOT_WORK]
            files = [name for name in files if name not in NOT_WORK]
        kept_dirs = []
        for name in sorted(dirs):
            path = here / name
            if stat.S_ISDIR(path.lstat().st_mode):
                entries.append(path)
                kept_dirs.append(name)
        dirs[:] = kept_dirs
        for name in sorted(files):
            path = here / name
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                continue
            if not os.access(path, os.R_OK):
                skipped.append(f"{path}: not readable")
                continue
            entries.append(path)
            total += info.st_size
    return entries, total, skipped


def save(work: Path, output: Path, shared: Path, limit: int | None) -> str:
    """The workspace as ``output``/workspace.tar; the line that says what was saved, or why not."""
    entries, total, skipped = saved_entries(work)
    if limit is not None and total > limit:
        return f"workspace not saved: its files hold {total} bytes, over the {limit} an artifact may{KEPT}"
    partial = shared / f".{WORKSPACE_TAR}.partial"
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        for path in entries:
            name = path.relative_to(work).as_posix()
            if path.is_dir() and not path.is_symlink():
                info = archive.gettarinfo(str(path), arcname=name)
                archive.addfile(_plain(info))
                continue
            try:
                handle = _open_regular(path)
            except OSError as exc:  # gone, or swapped for something else, since the listing
                skipped.append(f"{path}: {exc.strerror or exc}")
                continue
            with handle:
                info = archive.gettarinfo(str(path), arcname=name, fileobj=handle)
                archive.addfile(_plain(info), handle)
    size = partial.stat().st_size
    if limit is not None and size > limit:
        partial.unlink()
        return f"workspace not saved: its tar is {size} bytes, over the {limit} an artifact may{KEPT}"
    os.replace(partial, output / WORKSPACE_TAR)
    line = f"workspace saved: {len(entries)} entries, {size} bytes"
    return line + (f"; not readable, left out: {'; '.join(skipped[:5])}" if skipped else "")


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner in the tar: whoever restores it owns the copy."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pod_workspace.py COMMAND...", file=sys.stderr)
        return 2
    env = os.environ
    work = Path(env.get("SXWL_WORKSPACE", "/sxwl/work"))
    saved = Path(env["SXWL_WORKSPACE_SAVED"]) if env.get("SXWL_WORKSPACE_SAVED") else None
    output = Path(env.get("SXWL_OUTPUT_DIR", "/sxwl/output"))
    shared = Path(env.get("SXWL_SHARED_DIR", "/sxwl"))
    limit_text = env.get("SXWL_WORKSPACE_MAX_BYTES", "")
    limit = int(limit_text) if limit_text.isdigit() else None
    session = Session()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, session.handle)
    try:
        state = restore(work, saved, session)
    except Stopped:
        print("stopped during the restore: the workspace is not saved", file=sys.stderr)
        return 143
    if state == RESTORED:
        print("workspace restored from the copy another CPod saved", file=sys.stderr)
    elif state == UNFINISHED:
        print(f"an earlier restore of this workspace did not finish ({PARTIAL}): not saved", file=sys.stderr)
    code = 143
    if not session.stopping:
        session.child = subprocess.Popen(argv)
        if session.stopping:  # SIGTERM between the look and the start
            session.child.send_signal(signal.SIGTERM)
        code = session.child.wait()
        code = 128 - code if code < 0 else code
    try:
        if state != UNFINISHED:
            print(save(work, output, shared, limit), file=sys.stderr)
    except OSError as exc:
        print(f"workspace not saved: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
