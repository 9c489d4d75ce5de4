"""The wrapper around a Kubernetes job's command (sxwl/agent/runtimes/kube_wrapper.py), run by /bin/sh
itself as the main container runs it, and the uploader's wait for it (pod_uploader.wait_for_main)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from sxwl.agent import not_found, pod_uploader
from sxwl.agent.pod_uploader import wait_for_main
from sxwl.agent.runtimes.kube_wrapper import wrapped
from tests.support.agent import eventually


def start(command: list[str] | str, shared: Path) -> subprocess.Popen[bytes]:
    env = {"PATH": "/usr/bin:/bin", "SXWL_SHARED_DIR": str(shared), "SXWL_OUTPUT_DIR": str(shared / "output")}
    # SIGINT as a pod's shell gets it: a test run started in the background (``cmd &``) ignores it,
    # and a shell cannot trap a signal that was ignored when it started.
    return subprocess.Popen(
        wrapped(command), env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )


def test_the_exit_status_is_kept_and_written_for_the_uploader(tmp_path: Path) -> None:
    shared = tmp_path / "sxwl"
    shared.mkdir()
    proc = start(
        'echo weights > "$SXWL_OUTPUT_DIR/model.bin"; chmod 600 "$SXWL_OUTPUT_DIR/model.bin"; exit 3', shared
    )
    assert proc.wait(30) == 3
    assert (shared / "exit-code").read_text() == "3\n"
    assert wait_for_main(shared) == 3
    # Made readable to the uploader, which runs as another user.
    assert stat.S_IMODE((shared / "output" / "model.bin").stat().st_mode) & 0o044 == 0o044

    # A list runs exactly as given: no shell between (the '*' is not expanded), 127 when not found.
    assert start(["/bin/sh", "-c", 'test "$0" = "*"', "*"], shared).wait(30) == 0
    assert start(["no-such-command-here"], shared).wait(30) == 127
    assert (shared / "exit-code").read_text() == "127\n"


def test_sigterm_reaches_the_command_which_can_save_before_it_exits(tmp_path: Path) -> None:
    shared = tmp_path / "sxwl"
    shared.mkdir()
    script = (
        "trap 'echo saved > \"$SXWL_OUTPUT_DIR/ckpt\"; exit 7' TERM; "
        'touch "$SXWL_OUTPUT_DIR/started"; while :; do sleep 0.1; done'
    )
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT is passed on as SIGTERM
        (shared / "output" / "ckpt").unlink(missing_ok=True)
        (shared / "output" / "started").unlink(missing_ok=True)
        proc = start(script, shared)
        eventually(lambda: (shared / "output" / "started").exists(), timeout=20, what="the command to start")
        proc.send_signal(sig)
        assert proc.wait(30) == 7
        assert (shared / "output" / "ckpt").read_text() == "saved\n"
        assert (shared / "exit-code").read_text() == "7\n"


def test_a_main_container_killed_whole_ends_the_wait_without_a_status(tmp_path: Path) -> None:
    shared = tmp_path / "sxwl"
    shared.mkdir()
    proc = start("sleep 60", shared)
    fifo = shared / "alive"
    eventually(lambda: fifo.exists() and stat.S_ISFIFO(fifo.stat().st_mode), timeout=20, what="the FIFO")
    result: list[int | None] = []
    waiter = threading.Thread(target=lambda: result.append(wait_for_main(shared)))
    waiter.start()
    time.sleep(1)
    assert waiter.is_alive()  # the main container lives: the uploader waits
    # The OOM killer with memory.oom.group kills every process of the container at once.
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False)
    proc.kill()
    for pid in children.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    proc.wait(30)
    waiter.join(10)
    assert result == [None] and not (shared / "exit-code").exists()


def test_a_pod_deleted_before_its_command_ever_ran_ends_the_wait(tmp_path: Path) -> None:
    """A main container that could not start (no /bin/sh in the image) never makes the FIFO: SIGTERM
    then ends the uploader's wait at once, instead of at the end of the grace."""
    shared = tmp_path / "sxwl"
    shared.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "SXWL_SHARED_DIR": str(shared),
        "SXWL_UPLOAD_URL": "http://127.0.0.1:9",
        "SXWL_JOB_ID": "j",
        "SXWL_ATTEMPT": "1",
        "SXWL_UPLOAD_TOKEN_FILE": str(tmp_path / "token"),
        "SXWL_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    (tmp_path / "token").write_text("sxup_x")
    uploader = subprocess.Popen(
        ["python3", "-I", pod_uploader.__file__], env=env, stderr=subprocess.PIPE, text=True
    )
    time.sleep(1.5)
    assert uploader.poll() is None  # waiting for the main container
    uploader.send_signal(signal.SIGTERM)
    assert uploader.wait(10) == 0
    message = (tmp_path / "termination-log").read_text()
    assert message == "ok: 0 files (0 bytes) uploaded; the main container ended without an exit status"


def test_the_fifo_appears_only_once_the_wrapper_holds_it(tmp_path: Path) -> None:
    """An uploader that opens the FIFO the moment it appears finds its writer there: never an end of
    file that would say the main container is gone before it started."""
    for attempt in range(20):
        shared = tmp_path / f"sxwl-{attempt}"
        shared.mkdir()
        proc = start("sleep 30", shared)
        fifo = shared / "alive"
        deadline = time.monotonic() + 20
        while not fifo.exists():
            assert time.monotonic() < deadline, "no FIFO"
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            try:
                data = os.read(fd, 512)
            except BlockingIOError:
                data = None  # a writer holds it
            assert data is None, f"attempt {attempt}: the FIFO had no writer"
        finally:
            os.close(fd)
            subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
            proc.kill()
            proc.wait(30)


def test_a_command_the_shell_cannot_find_is_named_with_its_versions_on_path(tmp_path: Path) -> None:
    """The wrapper's line after the shell's "not found" (in the local sandbox's words) names what is
    on PATH instead; the agent reads both from the container's termination message, the tail of its
    log (FallbackToLogsOnError), into the reason."""
    shared, bin_dir = tmp_path / "sxwl", tmp_path / "bin"
    shared.mkdir()
    bin_dir.mkdir()
    for name in ("pythonx3", "pythonx3.11", "pythonx3-config"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SXWL_SHARED_DIR": str(shared)}
    env["SXWL_OUTPUT_DIR"] = str(shared / "output")
    for command in ("pythonx train.py", ["pythonx", "train.py"]):
        ran = subprocess.run(
            wrapped(command), env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert ran.returncode == 127
        assert ran.stderr.splitlines()[-1] == "command not found: pythonx (on PATH: pythonx3, pythonx3.11)"
        said = not_found.shell_not_found(ran.stderr, 127, 0.5)
        assert said == not_found.NotFound("pythonx", ["pythonx3", "pythonx3.11"]), ran.stderr
    # Nothing of that name on PATH: the shell's line alone.
    ran = subprocess.run(
        wrapped("no-such-sxwl"), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert ran.returncode == 127 and len(ran.stderr.splitlines()) == 1
    assert not_found.shell_not_found(ran.stderr, 127, 0.5) == not_found.NotFound("no-such-sxwl", [])
    # A program of its own that exits 127 is left as it is.
    ran = subprocess.run(
        wrapped("exit 127"), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert (ran.returncode, ran.stderr) == (127, "")
