"""Runs one job's command and records its exit status in the job's directory.

The agent starts this as the leader of a new process group, so a stop reaches the whole job, and
the exit status survives an agent restart: a re-adopted job's outcome is read from the file. The
spec (argv, env with the job's secrets, cwd, the attempt's cgroups, how its network gets outbound
access) arrives on stdin and is never written to disk.

What the sandbox says before the job's command runs (bubblewrap's own words, or this Python's when
it cannot start inside) reaches the launcher apart from the job's output: when the command never
ran, those words are the attempt's reason, not a bare exit status; so is a shell's own "not found"
when nothing else ran (agent/not_found.py)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

EXIT_FILE = "exit_status"
REASON_FILE = "exit_reason"  # why the command could not run at all (``command not found: …``)
REASON_FD = 3  # where the exec shim (sandbox.EXEC_SHIM) finds the write end of the reason pipe
# Where bubblewrap writes its info (the sandbox's pid), and the exec shim's end of the socket on
# which it says the sandbox is set up and waits until its outbound network is.
NET_FDS = (4, 5)
NETWORK_LOG = "network.log"  # slirp4netns's own output
SETUP_TIMEOUT_S = 30.0
WORDS_MAX = 4000


def _above(ends: tuple[int, int]) -> tuple[int, int]:
    """Both ends moved above the fds the child gets: os.pipe() may hand out one of those itself."""
    moved = (fcntl.fcntl(ends[0], fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(ends[1], fcntl.F_DUPFD_CLOEXEC, 10))
    for fd in ends:
        os.close(fd)
    return moved


def _pipe_at(target: int, child_writes: bool) -> int:
    """A pipe with the child's end at ``target`` (inherited); returns the launcher's end."""
    read, write = _above(os.pipe())
    child, mine = (write, read) if child_writes else (read, write)
    os.dup2(child, target, inheritable=True)
    os.close(child)
    return mine


def _socket_at(target: int) -> socket.socket:
    """A socket pair with the child's end at ``target`` (inherited); returns the launcher's end."""
    pair = socket.socketpair()
    mine, child = _above((pair[0].detach(), pair[1].detach()))
    os.dup2(child, target, inheritable=True)
    os.close(child)
    return socket.socket(fileno=mine)


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    os.replace(temp, path)


def _joining(procs: list[str]) -> Callable[[], None]:
    """Moves the child into the attempt's cgroups before it runs anything: every process of the
    sandbox is born inside them."""

    def join() -> None:
        for path in procs:
            with open(path, "w") as handle:
                handle.write("0")

    return join


def _read_ready(fd: int, deadline: float, complete: Callable[[bytes], bool]) -> bytes:
    """What arrives on ``fd`` until ``complete`` says so, its writer closes it, or the deadline."""
    got = b""
    while not complete(got):
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got


def _info(data: bytes) -> bool:
    try:
        return "child-pid" in json.loads(data)
    except ValueError:
        return False


def _outbound(
    slirp: str, info_fd: int, shim: socket.socket, workdir: Path
) -> tuple[subprocess.Popen[bytes] | None, int, str]:
    """Gives the sandbox's network namespace its outbound link, once the sandbox is set up:
    slirp4netns, without access to the host's loopback, in a sandbox of its own. Returns it, the fd
    whose closing ends it, and why it failed ("" when it did not)."""
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    data = _read_ready(info_fd, deadline, _info)
    if not _info(data) or not _read_ready(shim.fileno(), deadline, bool):
        return None, -1, ""  # the sandbox ended before its command: its own words say why
    pid = json.loads(data)["child-pid"]
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    argv = [slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox"]
    argv += ["--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(pid), "tap0"]
    with (workdir / NETWORK_LOG).open("ab") as log:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w, exit_r)
            )
        except OSError as exc:
            proc, failed = None, f"cannot run {slirp}: {exc.strerror or exc}"
    os.close(ready_w)
    os.close(exit_r)
    if proc is not None:
        failed = "" if _read_ready(ready_r, deadline, bool) else "slirp4netns did not configure the network"
    os.close(ready_r)
    if failed and proc is not None:
        words = (workdir / NETWORK_LOG).read_text(errors="replace").strip().splitlines()[-3:]
        failed = "; ".join([failed, *words])
    return proc, exit_w, failed


def _shell_not_found(workdir: Path, status: int, elapsed: float, path: str | None) -> str:
    """The coded reason when the job's shell could not find its command and nothing else ran
    (agent/not_found.py), naming what is on the job's PATH instead; else ""."""
    # Imported only once the job ended: it brings the wire models (pydantic), whose import was
    # about 0.35 s of CPU on the way to every attempt's start.
    from sxwl.agent import not_found

    log = workdir / "output.log"
    if status != not_found.EXIT_STATUS or log.stat().st_size > not_found.OUTPUT_MAX:
        return ""
    said = not_found.shell_not_found(log.read_text(errors="replace"), status, elapsed)
    if said is None:
        return ""
    return not_found.reason(said.program, not_found.on_path(said.program, path)).stored


def main(workdir: Path) -> int:
    spec = json.loads(sys.stdin.buffer.read())
    # Ignored (not handled) so that bubblewrap, which forwards no signals, outlives a SIGTERM to the
    # group as well; the exec shim gives the job's command the default action back.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reasons = _pipe_at(REASON_FD, child_writes=True)
    slirp: str | None = spec.get("slirp")
    info_fd, shim = -1, None
    if slirp:
        info_fd = _pipe_at(NET_FDS[0], child_writes=True)
        shim = _socket_at(NET_FDS[1])
    words_r, words_w = os.pipe()
    reason = ""
    network: subprocess.Popen[bytes] | None = None
    network_end = -1
    # Only the agent reads the log (a job's output can hold what it printed of its secrets).
    log_fd = os.open(workdir / "output.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(log_fd, "ab") as log:
        began = time.monotonic()
        try:
            child = subprocess.Popen(
                spec["argv"],
                cwd=spec["cwd"],
                env=spec["env"],
                stdout=log,
                stderr=words_w,
                stdin=subprocess.DEVNULL,
                pass_fds=(REASON_FD, *(NET_FDS if slirp else ())),
                preexec_fn=_joining(spec.get("cgroups", [])),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            child, reason = None, f"the job could not be started: {exc}"
        for fd in (REASON_FD, *(NET_FDS if slirp else ()), words_w):
            os.close(fd)
        if child is not None and slirp and shim is not None:
            network, network_end, failed = _outbound(slirp, info_fd, shim, workdir)
            if failed:
                child.kill()
                reason = f"the job's network could not be set up: {failed}"
            else:
                # The sandbox goes on: its command runs, with its network. Gone already: its words say why.
                with contextlib.suppress(OSError):
                    shim.send(b"g")
        if shim is not None:
            shim.close()
            os.close(info_fd)
        code = child.wait() if child is not None else 126
        elapsed = time.monotonic() - began
        os.set_blocking(words_r, False)
        try:
            words = os.read(words_r, WORDS_MAX).decode(errors="replace").strip()
        except BlockingIOError:
            words = ""
        if words:
            log.write(words.encode() + b"\n")
    if network is not None:
        os.close(network_end)  # its exit fd: slirp4netns ends
        try:
            network.wait(5)
        except subprocess.TimeoutExpired:
            network.kill()
    reason = reason or os.read(reasons, 4096).decode(errors="replace").strip()
    if not reason and code != 0 and words:
        reason = words  # the command never ran: the sandbox (or this Python inside it) says why
    status = 128 - code if code < 0 else code  # killed by signal N → 128 + N, as shells report it
    if not reason and child is not None:
        reason = _shell_not_found(workdir, status, elapsed, spec["env"].get("PATH"))
    if reason:
        _write_atomically(workdir / REASON_FILE, reason)
    _write_atomically(workdir / EXIT_FILE, str(status))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
