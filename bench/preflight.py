"""`3kctl preflight` over many loopback hosts: parallel against sequential, in one run.

Starts N real sshd processes (Debian openssh-server) on 127.0.0.2 … 127.0.0.N+1, each with its own
host key, hostname and machine id (tests/ctl/hosts.py), then runs the same preflight twice in
process: one host at a time (``--parallel 1``) and all hosts at once (the default limit), each with
a fresh known_hosts file so both do identical work (TOFU recording included). Prints the wall times
and their ratio and appends a dated section to bench/RESULTS.md. Needs root (unshare, mounts).
Run: ``.venv/bin/python bench/preflight.py [--hosts 50]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, utc_now  # noqa: E402
from tests.ctl.hosts import SshdHost, config_text, have_sshd, keygen  # noqa: E402

from sxwl.ctl import config as cfg  # noqa: E402
from sxwl.ctl.preflight import Report, run_preflight  # noqa: E402
from sxwl.ctl.ssh import DEFAULT_CONCURRENCY, KnownHosts, SshPool  # noqa: E402


async def timed(config: cfg.ClusterConfig, known: Path, parallel: int) -> tuple[float, float, Report]:
    """Wall time and this process's CPU time (the SSH client's share) of one preflight run."""
    started, cpu = time.perf_counter(), time.process_time()
    async with SshPool(KnownHosts(known), parallel) as pool:
        report = await run_preflight(pool, config)
    return time.perf_counter() - started, time.process_time() - cpu, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    if not have_sshd():
        sys.exit("needs root, /usr/sbin/sshd and unshare: run scripts/install-test-deps.sh as root")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key = keygen(root / "id_ed25519")
        names = ["master1"] + [f"worker{i}" for i in range(1, args.hosts)]
        hosts: list[SshdHost] = []
        try:
            for index, name in enumerate(names):
                hosts.append(SshdHost(name, f"127.0.0.{index + 2}", root / "hosts" / name, key).start())
            path = root / "conf" / "config.conf"
            path.parent.mkdir()
            path.write_text(config_text(hosts, key))
            config = cfg.load(path)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            sequential, seq_cpu, seq_report = asyncio.run(timed(config, root / "known_seq", 1))
            parallel, par_cpu, par_report = asyncio.run(
                timed(config, root / "known_par", DEFAULT_CONCURRENCY)
            )
        finally:
            for host in hosts:
                host.stop()
        # The sshd processes (and the sessions they reaped) are children: their CPU is known once stopped.
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    for label, report in (("sequential", seq_report), ("parallel", par_report)):
        unreachable = [h.host for h in report.hosts if h.checks["reachable"].status != "ok"]
        if unreachable:
            sys.exit(
                f"{label} run could not reach {len(unreachable)} hosts, e.g. {unreachable[:3]}: no result"
            )
    ratio = sequential / parallel
    load_after = os.getloadavg()[0]
    per_host_ms = server_cpu / (2 * args.hosts) * 1000
    floor = server_cpu / 2 / (os.cpu_count() or 1)
    summary = (
        f"{args.hosts} hosts: sequential {sequential:.2f} s, parallel {parallel:.2f} s "
        f"(limit {DEFAULT_CONCURRENCY}) → {ratio:.1f}× faster; host side {per_host_ms:.0f} ms CPU per host, "
        f"client {seq_cpu:.2f} / {par_cpu:.2f} s CPU; CPU floor {floor:.2f} s, so at most "
        f"{sequential / floor:.1f}× here"
    )
    print(summary)
    if args.no_record:
        return
    now = utc_now()
    section = (
        f"\n## 3kctl preflight — {now}\n{DESCRIPTION}\n"
        f"- machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}\n"
        f"- 1-minute load average: {load_before:.2f} before, {load_after:.2f} after "
        "(includes the sshd processes and other work on the machine)\n"
        f"- hosts: {args.hosts} sshd processes on 127.0.0.2 … 127.0.0.{args.hosts + 1}, one SSH session and "
        f"one facts command each, checks judged in process\n\n"
        f"| run | wall time (s) |\n|---|--:|\n| sequential (`--parallel 1`) | {sequential:.2f} |\n"
        f"| parallel (limit {DEFAULT_CONCURRENCY}) | {parallel:.2f} |\n\n"
        f"parallel/sequential: **{ratio:.1f}×** faster; target 10× and under 10 s.\n\n"
        f"CPU: the hosts' side (sshd, login, the facts script) took {per_host_ms:.0f} ms per host, so one "
        f"run needs at least {floor:.1f} s of this machine's {os.cpu_count()} CPUs whatever the "
        f"parallelism; the SSH client (this process) used {seq_cpu:.2f} s sequential and {par_cpu:.2f} s "
        "parallel. On real hosts that side runs on each host's own CPUs.\n\n"
        f"Bound: no parallelism can finish faster than that floor, so on this machine the ratio is at "
        f"most {sequential:.2f} / {floor:.2f} = **{sequential / floor:.1f}×**; the 10× target needs the "
        "hosts' work off these CPUs (real hosts), which a single 2-CPU machine cannot provide.\n"
    )
    with RESULTS.open("a") as handle:
        handle.write(section)


DESCRIPTION = """
`bench/preflight.py`: `3kctl preflight`'s checks against N loopback sshd hosts, twice in one process,
one host at a time and all at once. The client, the N sshd processes and every session's shell share
this machine's CPUs (and, here, other sessions' work), so the parallel figure is bounded by CPU, not by
the network as on real hosts.
"""


if __name__ == "__main__":
    main()
