"""What a dev environment's user waits for (docs/dev-envs.md), on a warm local CPod, in one run:

- **create → usable**: from `POST /api/v1/dev-envs` to the first kernel execution (`1+1` answered
  over the kernel's WebSocket through the cloud and the tunnel), after one environment was created
  and stopped first so that the CPod's disk cache holds JupyterLab (a warm CPod);
- **resume → usable**: from `POST …/resume` of the paused environment to the same first execution;
- **where that time goes**, for both: the job's events (placed by the scheduler, started by the
  agent, reported running), JupyterLab's own log (its first line, once its Python has imported
  enough to log; its socket serving), the cloud's proxy first answering, the kernel made, the
  execution;
- **SSH throughput**: `scp` of ``--scp-mib`` MiB into the workspace through `sxwl dev ssh-proxy`
  (the cloud, the tunnel, the agent) against `scp` to the same sshd directly (a ProxyCommand that
  connects to the environment's ssh.sock on the CPod), alternated ``--rounds`` times.

The world is tests/test_dev_envs.py's: `sxwl serve` on SQLite, a real `sxwl-agent` (one simulated
GPU, local runtime, bubblewrap sandbox) running a real JupyterLab. The client, the cloud, the agent,
JupyterLab and sshd share this machine's CPUs. Appends a dated section to bench/RESULTS.md.
Run: ``.venv/bin/python bench/dev_envs.py``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
import pytest  # noqa: E402
from bench.common import Processes, append_results, interrupt_on_sigterm, machine_line, utc_now  # noqa: E402
from tests.support.browser import PASSWORD  # noqa: E402
from tests.test_dev_envs import PRODUCT, World, console, kernel_says  # noqa: E402

TARGETS = {"create": 10.0, "resume": 5.0, "ssh": 0.5}


def verdict(value: float, target: float, above: bool = False) -> str:
    return "met" if (value >= target if above else value < target) else "not met"


def relay(path: str) -> None:
    """``--relay PATH``: a ProxyCommand that joins stdin and stdout to a Unix socket (no netcat here)."""
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)

    def upload() -> None:
        while data := os.read(0, 65536):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)

    threading.Thread(target=upload, daemon=True).start()
    while data := conn.recv(65536):
        os.write(1, data)


# What a start's timeline names, in the order it happens, each in seconds from the user's request.
STEPS = {
    "assigned": "placed by the scheduler",
    "starting": "started in its sandbox by the agent",
    "lab_log": "JupyterLab's first log line",
    "lab_serving": "JupyterLab serving on its socket",
    "running": "reported running",
    "proxied": "answering through the cloud",
    "kernel": "kernel started",
    "executed": "first execution",
}
# JupyterLab's log lines start with their local time: "[I 2026-12-07 00:23:49.005 ServerApp] ...".
LAB_LINE = re.compile(r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \w+\] (.*)$", re.MULTILINE)
POLL_S = 0.1  # the bench's own polling: often enough to see each step, rarely enough to cost little


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``check`` every POLL_S until it holds; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Site:
    """The cloud the bench measures through: its URL, the user's API headers, the owner's console
    session (a browser's cookies, as tests/test_dev_envs.py's ``console`` makes them), and how long
    a start may take there."""

    url: str
    user: dict[str, str]
    console: Callable[[], httpx.Client]
    start_timeout_s: float = 120


def usable(site: Site, env_id: str, started: float) -> dict[str, float]:
    """The timeline (STEPS) of the environment's start, ``started`` being the wall-clock time of
    the user's request, until a new kernel of the environment executes `1+1`."""
    url, user, browser = site.url, site.user, site.console()
    base = f"/dev/{env_id}"
    job: dict[str, str] = {}

    def lab_up() -> bool:
        env = httpx.get(f"{url}/api/v1/dev-envs/{env_id}", headers=user).json()
        assert env["status"] in ("queued", "starting", "running"), env
        job["id"] = env["job_id"]
        return env["status"] == "running" and browser.get(f"{base}/api/status").status_code == 200

    until(lab_up, timeout=site.start_timeout_s, what="JupyterLab")
    seen = {"proxied": time.time() - started}
    browser.get(f"{base}/lab")  # JupyterLab's _xsrf cookie, as a browser gets it
    xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf") or ""}
    kernel = browser.post(f"{base}/api/kernels", json={"name": "python3"}, headers=xsrf)
    assert kernel.status_code == 201, kernel.text
    seen["kernel"] = time.time() - started
    assert kernel_says(url, browser, env_id, kernel.json()["id"], "1+1") == "2"
    seen["executed"] = time.time() - started
    events = httpx.get(f"{url}/api/v1/jobs/{job['id']}/events", headers=user).json()
    for event in events:
        if event["kind"] in STEPS:
            seen[event["kind"]] = datetime.datetime.fromisoformat(event["at"]).timestamp() - started
    log = httpx.get(f"{url}/api/v1/jobs/{job['id']}/logs", headers=user).text
    lines = [
        (datetime.datetime.fromisoformat(at).timestamp() - started, text)
        for at, text in LAB_LINE.findall(log)
    ]
    if lines and 0 <= lines[0][0] <= seen["executed"]:  # the sandbox's local time is the bench's
        seen["lab_log"] = lines[0][0]
        serving = [at for at, text in lines if "is running at" in text]
        if serving:
            seen["lab_serving"] = serving[0]
    return seen


def timeline(seen: dict[str, float]) -> str:
    """The steps in the order they happened, each with the time it took after the one before."""
    steps = sorted((at, step) for step, at in seen.items())
    parts, before = [], 0.0
    for at, step in steps:
        parts.append(f"{STEPS[step]} {at:.1f} s (+{at - before:.1f})")
        before = at
    return "; ".join(parts)


def status_is(site: Site, env_id: str, status: str) -> bool:
    got: str = httpx.get(f"{site.url}/api/v1/dev-envs/{env_id}", headers=site.user).json()["status"]
    return got == status


def create(site: Site, body: dict[str, object]) -> tuple[str, dict[str, float]]:
    started = time.time()
    made = httpx.post(f"{site.url}/api/v1/dev-envs", headers=site.user, json=body)
    assert made.status_code == 201, made.text
    env_id: str = made.json()["id"]
    return env_id, usable(site, env_id, started)


@dataclass(frozen=True)
class Starts:
    """The timelines of one run's starts: a cold first create, a create on the warm CPod, and the
    resume of that environment after a pause; ``env_id``: that environment (running at the end)."""

    cold: dict[str, float]
    created: dict[str, float]
    resumed: dict[str, float]
    env_id: str


def starts(site: Site, body: dict[str, object]) -> Starts:
    """A first environment created and stopped (it fills the CPod's disk cache: not counted), then
    one created, paused and resumed, each start timed to its first kernel execution."""
    warm_id, cold = create(site, {**body, "name": "warm-up"})
    httpx.delete(f"{site.url}/api/v1/dev-envs/{warm_id}", headers=site.user).raise_for_status()
    until(lambda: status_is(site, warm_id, "stopped"), timeout=120, what="the warm-up stopped")
    env_id, created = create(site, {**body, "name": "bench"})
    httpx.post(f"{site.url}/api/v1/dev-envs/{env_id}/pause", headers=site.user).raise_for_status()
    until(lambda: status_is(site, env_id, "paused"), timeout=120, what="the environment paused")
    started = time.time()
    httpx.post(f"{site.url}/api/v1/dev-envs/{env_id}/resume", headers=site.user).raise_for_status()
    return Starts(cold, created, usable(site, env_id, started), env_id)


def start_lines(found: Starts) -> list[str]:
    """The report's lines of ``found``, with the targets."""
    cold, created, resumed = (steps["executed"] for steps in (found.cold, found.created, found.resumed))
    return [
        f"- create → first kernel execution: **{created:.1f} s** (target < {TARGETS['create']:.0f} s, "
        f"{verdict(created, TARGETS['create'])}); the cold first create, before it: {cold:.1f} s",
        f"- resume → first kernel execution: **{resumed:.1f} s** (target < {TARGETS['resume']:.0f} s, "
        f"{verdict(resumed, TARGETS['resume'])})",
        f"- where the create's time went: {timeline(found.created)}",
        f"- where the resume's time went: {timeline(found.resumed)}",
    ]


def scp_seconds(cli_env: dict[str, str], key: Path, proxy: str, source: Path, env_id: str) -> float:
    options = ["-F", "/dev/null", "-i", str(key), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
               "-o", f"ProxyCommand={proxy}"]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(
        ["scp", *options, str(source), f"sxwl@{env_id}:big.bin"], env=cli_env, check=True, timeout=600
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scp-mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-append", action="store_true", help="print the results only")
    parser.add_argument("--relay", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay:
        relay(args.relay)
        return
    processes = Processes()
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory() as tmp:
        try:
            run(Path(tmp), args, processes)
        finally:
            processes.stop_all()


def run(root: Path, args: argparse.Namespace, processes: Processes) -> None:
    load_before = os.getloadavg()[0]
    monkeypatch = pytest.MonkeyPatch()
    processes.add(monkeypatch.undo)
    world = World(root, monkeypatch)
    processes.add(world.close)
    cli_env = {**os.environ, "SXWL_CONFIG_DIR": str(root / "cfg")}
    cli = [sys.executable, "-m", "sxwl.cli"]
    login = [*cli, "login", "--url", world.url, "--email", "dev@example.com", "--password-stdin"]
    subprocess.run(login, input=PASSWORD, env=cli_env, text=True, check=True, capture_output=True)
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    add = [*cli, "ssh-keys", "add", f"{key}.pub"]
    subprocess.run(add, env=cli_env, check=True, capture_output=True)

    site = Site(world.url, world.user, lambda: console(world.url, "dev@example.com"))
    found = starts(site, {"gpus": 1, "gpu_product": PRODUCT})
    env_id = found.env_id

    source = root / "big.bin"
    with source.open("wb") as out:
        for _ in range(args.scp_mib):
            out.write(os.urandom(1 << 20))
    sock = world.root / "agent" / "workspaces" / env_id / ".sxwl-dev" / "ssh.sock"
    proxies = {
        "tunnel": f"{sys.executable} -m sxwl.cli dev ssh-proxy {env_id}",
        "direct": f"{sys.executable} {Path(__file__).resolve()} --relay {sock}",
    }
    seconds: dict[str, list[float]] = {"tunnel": [], "direct": []}
    for _ in range(args.rounds):
        for kind, proxy in proxies.items():
            seconds[kind].append(scp_seconds(cli_env, key, proxy, source, env_id))
    mib_s = {kind: args.scp_mib / statistics.median(s) for kind, s in seconds.items()}
    ratio = mib_s["tunnel"] / mib_s["direct"]
    load_after = os.getloadavg()[0]

    times = {kind: ", ".join(f"{s:.1f}" for s in runs) for kind, runs in seconds.items()}
    ssh_met = verdict(ratio, TARGETS["ssh"], above=True)

    lines = [
        f"## dev_envs: {utc_now()}",
        "",
        "`bench/dev_envs.py`: a real agent (local runtime, sandbox) running a real JupyterLab, reached "
        "through `sxwl serve` and the tunnel; all processes share this machine's CPUs.",
        "",
        machine_line(),
        f"- 1-minute load average: {load_before:.2f} before, {load_after:.2f} after (other work on "
        "the machine shares the 2 cores; anything above ~2 skews the figures)",
        "",
        *start_lines(found),
        f"- `scp` of {args.scp_mib} MiB into the workspace, median of {args.rounds}: through the tunnel "
        f"{mib_s['tunnel']:.1f} MiB/s ({times['tunnel']} s), directly "
        f"to the same sshd {mib_s['direct']:.1f} MiB/s ({times['direct']} s); "
        f"ratio **{ratio:.2f}** (target ≥ {TARGETS['ssh']:.2f}, {ssh_met})",
    ]
    print("\n".join(lines))
    if not args.no_append:
        append_results("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
