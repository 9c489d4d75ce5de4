"""Runs one job's command and records its exit status in the job's directory.

The agent starts this as the leader of a new process group, so a stop reaches the whole job, and
the exit status survives an agent restart: a re-adopted job's outcome is read from the file. The
spec (argv, env with the job's secrets, cwd) arrives on stdin and is never written to disk."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

EXIT_FILE = "exit_status"
REASON_FILE = "exit_reason"  # why the command could not run at all (``command not found: …``)
REASON_FD = 3  # where the exec shim (sandbox.EXEC_SHIM) finds the write end of the reason pipe


def _reason_pipe() -> int:
    """The read end; the write end sits at REASON_FD for the child to inherit."""
    # Both ends moved above REASON_FD first: os.pipe() may hand out fd 3 itself.
    ends = os.pipe()
    read, write = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in ends)
    for fd in ends:
        os.close(fd)
    os.dup2(write, REASON_FD, inheritable=True)
    os.close(write)
    return read


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    os.replace(temp, path)


def main(workdir: Path) -> int:
    spec = json.loads(sys.stdin.buffer.read())
    # Ignored (not handled) so that bubblewrap, which forwards no signals, outlives a SIGTERM to the
    # group as well; the exec shim gives the job's command the default action back.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reasons = _reason_pipe()
    # Only the agent reads the log (a job's output can hold what it printed of its secrets).
    log_fd = os.open(workdir / "output.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(log_fd, "ab") as log:
        child = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            pass_fds=(REASON_FD,),
        )
        os.close(REASON_FD)
        code = child.wait()
    reason = os.read(reasons, 4096).decode(errors="replace").strip()
    if reason:
        _write_atomically(workdir / REASON_FILE, reason)
    status = 128 - code if code < 0 else code  # killed by signal N → 128 + N, as shells report it
    _write_atomically(workdir / EXIT_FILE, str(status))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
