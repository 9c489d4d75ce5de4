"""The local agent's start-up check (docs/agent.md, "Isolation"): one real attempt, through the same
launcher, sandbox, uid, cgroups and network as a job's, reads a file in its work dir, writes one in
its output dir and imports the agent's ``sxwl`` with the agent's Python, as the trainer does. When
it cannot, the CPod takes no jobs, and its nodes say why on 算力详情 (``LocalRuntime.problem``)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from sxwl.agent.inputs import writable_tree
from sxwl.agent.runtimes.launcher import EXIT_FILE, REASON_FILE
from sxwl.agent.runtimes.local import INHERITED_ENV, LocalRuntime
from sxwl.agent.runtimes.sandbox import UID_BASE
from sxwl.agent.runtimes.sandbox_mounts import CODE_ROOT
from sxwl.protocol.models import REASON_MAX_CHARS

log = logging.getLogger("sxwl.agent.local")

CHECK_DIR = "check"
# Below the attempts' range: never one a running attempt holds.
CHECK_UID = UID_BASE - 1
TIMEOUT_S = 60.0
SCRIPT = """
import os, pathlib
home, output = pathlib.Path(os.environ["HOME"]), pathlib.Path(os.environ["SXWL_OUTPUT_DIR"])
assert (home / "check-in").read_text() == "in", "the work dir's file reads wrong"
(output / "check-out").write_text("out")
import sxwl.protocol.finetune
"""


def check(runtime: LocalRuntime) -> str | None:
    """Runs the check; sets and returns ``runtime.problem`` (None: jobs can run here)."""
    problem = _run(runtime)
    if problem is not None:
        problem = f"jobs cannot run on this CPod: {problem}"
        if len(problem) > REASON_MAX_CHARS:
            problem = problem[: REASON_MAX_CHARS - 1] + "…"
        log.error("%s; it takes no jobs until an agent started after the fix passes this check", problem)
    else:
        log.info("start-up check passed: a sandboxed job reads and writes its dirs")
    runtime.problem = problem
    return problem


def _remove(runtime: LocalRuntime) -> None:
    workdir = runtime.state_dir / CHECK_DIR
    if workdir.exists():
        writable_tree(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    runtime.cgroups.remove(runtime.cgroup_name(CHECK_DIR, 0), wait_s=5)


def _run(runtime: LocalRuntime) -> str | None:
    _remove(runtime)  # a check of an agent that died in the middle
    uid = CHECK_UID if runtime.isolation.own_uids else None
    workdir = runtime.state_dir / CHECK_DIR
    try:
        runtime.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths = runtime.make_dirs(workdir, uid)
        given = paths.work / "check-in"
        given.write_text("in")
        os.chmod(given, 0o600)
        if uid is not None:
            os.chown(given, uid, uid)
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.update(runtime.job_env(paths), PYTHONPATH=str(CODE_ROOT))
        command = [sys.executable, "-c", SCRIPT]
        proc = runtime.launch(workdir, paths, command, env, uid, [], runtime.cgroup_name(CHECK_DIR, 0))
        try:
            proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"a sandboxed command did not end within {TIMEOUT_S:.0f} s"
        if runtime.cgroups.oom_kills(runtime.cgroup_name(CHECK_DIR, 0)):
            limit = (runtime.setup.bounds.memory_bytes or 0) / 2**20
            return (
                f"the memory limit of {limit:.0f} MiB (--job-memory-limit) is too small for a Python to start"
            )
        return _verdict(workdir, uid)
    except (OSError, RuntimeError) as exc:
        return str(exc)
    finally:
        _remove(runtime)


def _verdict(root: Path, uid: int | None) -> str | None:
    status = (root / EXIT_FILE).read_text().strip() if (root / EXIT_FILE).exists() else "none"
    written = root / "output" / "check-out"
    if status == "0" and written.is_file() and written.read_text() == "out":
        owner = written.stat().st_uid
        if uid is None or owner == uid:
            return None
        return f"the check's output belongs to uid {owner}, not to the attempt's uid {uid}"
    if (root / REASON_FILE).exists():
        return (root / REASON_FILE).read_text().strip()
    # No status at all: the launcher itself failed, and its log says how.
    said_where = root / ("output.log" if status != "none" else "launcher.log")
    said = said_where.read_text(errors="replace").strip().splitlines()[-3:] if said_where.exists() else []
    return f"a sandboxed command ended with status {status}: " + " / ".join(said)
