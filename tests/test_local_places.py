"""A job runs wherever the agent's Python and state dir are (docs/agent.md, "Isolation"): below /tmp,
which a job's sandbox replaces with a tmpfs of its own, and below a dir the job's uid cannot search
(root's home, any ``mktemp -d``), with spaces in the path. When the sandbox cannot start a job, the
job fails with the sandbox's own words; when it cannot start any, the agent's start-up check finds
it, the CPod takes no jobs and 算力详情 says why. Real agents, real bubblewrap."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pydantic
import pytest

from sxwl.agent.runtimes.local import LocalRuntime
from sxwl.agent.runtimes.local_check import check
from sxwl.agent.runtimes.sandbox import detect
from sxwl.agent.runtimes.sandbox_mounts import CODE_ROOT
from sxwl.protocol import Assignment, Node
from tests.support.agent import eventually
from tests.support.places import private_dir
from tests.test_jobs_process import World

__all__ = ["private_dir"]  # the fixture

needs_root_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bubblewrap"
)

# Reads and writes its dirs by the paths it was given, and runs the agent's Python, as the demo job
# of `sxwl up` and every fine-tune do.
SCRIPT = (
    'echo note > "$HOME/note" && cat "$HOME/note"; '
    'echo weights > "$SXWL_OUTPUT_DIR/model.bin"; '
    '"$AGENT_PYTHON" -c "import sys; print(\'python at\', sys.prefix)"'
)


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def python_below(root: Path) -> tuple[Path, dict[str, str]]:
    """A venv below ``root`` with this interpreter's packages, and a copy of this checkout's sxwl
    beside it, as a fresh clone under /tmp has them; returns its python and the agent's env."""
    home = root / "clone"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(home / ".venv")
    (site,) = (home / ".venv" / "lib").glob("python3*/site-packages")
    # Where the packages really are (a clone's venv has its own; this one borrows them).
    packages = Path(pydantic.__file__).parent.parent
    (site / "_packages.pth").write_text(f"import site; site.addsitedir({str(packages)!r})\n")
    shutil.copytree(CODE_ROOT / "sxwl", home / "src" / "sxwl", ignore=shutil.ignore_patterns("__pycache__"))
    return home / ".venv" / "bin" / "python", {"PYTHONPATH": str(home / "src")}


@needs_root_bwrap
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("where", ["below /tmp", "below a 0700 dir, with spaces"])
def test_jobs_run_wherever_the_agent_and_its_state_live(
    where: str, world: World, tmp_path: Path, private_dir: Path
) -> None:
    if where == "below /tmp":
        assert str(tmp_path).startswith("/tmp/")
        python, env = python_below(tmp_path)
        agent = world.agent("a", 1, state_dir=tmp_path / "agent state", python=str(python), env=env)
    else:
        python = Path(sys.executable)
        agent = world.agent("a", 1, state_dir=private_dir / "agent state")
    world.online()
    assert "start-up check passed" in agent.log, agent.log
    job_id = world.submit(SCRIPT, env={"AGENT_PYTHON": str(python)})
    job = world.wait_state(job_id, "succeeded", "failed", timeout=60)
    logs = world.logs(job_id)
    assert job["state"] == "succeeded", (job["reason"], logs)
    assert "note\n" in logs
    assert f"python at {python.parent.parent}" in logs
    got = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts/model.bin", headers=world.user)
    assert got.status_code == 200 and got.content == b"weights\n"


def unseen_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This Python by a path the sandbox does not show (a link below /tmp, which it replaces): what
    the agent runs in every sandbox cannot start there."""
    link = tmp_path / "elsewhere" / "python"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(link))
    # The link is outside the venv: the launcher it starts (outside the sandbox) finds sxwl only here.
    monkeypatch.setenv("PYTHONPATH", str(CODE_ROOT))
    return link


def assignment(command: str) -> Assignment:
    return Assignment(
        job_id="j" * 32, attempt=1, name="t", owner_id="u", command=command, gpus_per_node=0, nodes=1
    )


@needs_root_bwrap
def test_a_job_the_sandbox_cannot_start_fails_with_the_sandboxs_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = LocalRuntime(tmp_path / "state", [], isolation=detect("required"))
    link = unseen_python(tmp_path, monkeypatch)
    job = runtime.start(assignment("echo never"))
    eventually(lambda: runtime.poll(), timeout=60, what="the job to end")
    words = f"bwrap: execvp {link}: No such file or directory"
    assert (job.outcome, job.exit_code, job.stop_reason) == ("failed", 1, words)
    assert words in runtime.log_path(job).read_text()  # the user reads them in the log too
    runtime.done(job)


@needs_root_bwrap
def test_an_agent_whose_sandbox_cannot_run_a_job_takes_none_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = LocalRuntime(tmp_path / "state", [], isolation=detect("required"))
    link = unseen_python(tmp_path, monkeypatch)
    problem = check(runtime)
    assert problem == f"jobs cannot run on this CPod: bwrap: execvp {link}: No such file or directory"
    assert runtime.problem == problem
    assert not (tmp_path / "state" / "check").exists()  # the check's attempt is gone
    with pytest.raises(RuntimeError, match="jobs cannot run on this CPod"):
        runtime.start(assignment("echo never"))
    (node,) = runtime.nodes_to_report([Node(name="n", status="ready", cpu_cores=2, memory_mib=1024)])
    assert (node.status, node.reason) == ("not_ready", problem)
    monkeypatch.undo()
    assert check(runtime) is None and runtime.problem is None  # an agent started after the fix
    (node,) = runtime.nodes_to_report([Node(name="n", status="ready", cpu_cores=2, memory_mib=1024)])
    assert (node.status, node.reason) == ("ready", None)


def compute_page(world: World, email: str) -> str:
    with httpx.Client(base_url=world.url) as browser:
        form = browser.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert token, form.text
        browser.post(
            "/login", data={"csrf_token": token.group(1), "email": email, "password": "correct horse"}
        )
        page = browser.get("/compute")
        assert page.status_code == 200, page.text
        return page.text


@needs_root_bwrap
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cpod_whose_start_up_check_fails_gets_no_job_and_its_page_says_why(world: World) -> None:
    # A bound no Python starts in: a provider's mistake the check finds before any job does.
    agent = world.agent("a", 1, "--job-memory-limit", "4Mi")
    world.online()
    why = "the memory limit of 4 MiB (--job-memory-limit) is too small for a Python to start"
    assert why in agent.log, agent.log

    def refusing() -> list[dict[str, object]] | None:
        (cpod,) = httpx.get(f"{world.url}/api/v1/cpods", headers=world.provider).json()
        nodes: list[dict[str, object]] = cpod["nodes"]
        return nodes if nodes and nodes[0]["status"] == "not_ready" else None

    (node,) = eventually(refusing, what="the CPod's node reported not ready")
    assert node["reason"] == f"jobs cannot run on this CPod: {why}"
    job_id = world.submit("echo never")
    time.sleep(2)  # several scheduling passes (0.2 s apart here)
    assert world.job(job_id)["state"] == "queued"
    page = compute_page(world, "owner@example.com")
    assert "此 CPod 不接收任务" in page and why in page
