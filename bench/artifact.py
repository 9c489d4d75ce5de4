"""`make artifact`: the offline artifact's size by part and its build time, warm and (with --cold)
cold, with the time of each part as the build prints it; and whether two warm builds give the same
sha256 (they must: docs/artifact.md, "Building"). Then `3kctl deploy all`'s time by step against the
stood-in cluster of the ctl tests (sshd hosts on loopback, KubeKey and helm recorded stand-ins, a real
cloud and an agent that registers the CPod). Appends a dated section to bench/RESULTS.md.

Warm: the Go-built binaries are in .cache/artifact (or the test control plane's). Cold (--cold): an
empty build cache and an empty Go build cache, so kubectl and helm are compiled (the module downloads
stay cached in GOMODCACHE): minutes on a 2-core machine.
Run: ``.venv/bin/python bench/artifact.py [--cold]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import append_results, machine_line, utc_now
from tests.ctl.conftest import make_artifact
from tests.ctl.hosts import SshdHost, config_text, have_sshd, keygen
from tests.ctl.test_deploy import provider_key
from tests.support.agent import AgentProcess
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[1]
PART = re.compile(r"^\[artifact\] (.+): (\d+\.\d)s$")
STEP = re.compile(r"✓ \[\d+/\d+\] ([a-z-]+): .* \((\d+\.\d)s\)$")


def build(output: Path, env: dict[str, str], *extra: str) -> tuple[float, dict[str, float], str]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sxwl.artifactbuild", "-o", str(output), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start
    if proc.returncode not in (0, 3):  # 3: a PARTIAL artifact, written all the same
        raise SystemExit(f"the build failed ({proc.returncode}):\n{proc.stderr}")
    parts = {m.group(1): float(m.group(2)) for m in map(PART.match, proc.stderr.splitlines()) if m}
    return wall, parts, hashlib.sha256(output.read_bytes()).hexdigest()


def sizes(output: Path) -> dict[str, int]:
    by_part: dict[str, int] = {}
    with tarfile.open(output) as tar:
        for member in tar.getmembers():
            if member.isreg():
                top = member.name.split("/")[1]
                by_part[top] = by_part.get(top, 0) + member.size
    return dict(sorted(by_part.items(), key=lambda item: -item[1]))


def deploy_steps(work: Path) -> tuple[float, dict[str, float]]:
    """deploy all against 2 sshd hosts with the recorded stand-ins: (wall s, {step: s})."""
    work.mkdir()
    key = keygen(work / "id_ed25519")
    names = ["master1", "worker1"]
    hosts = [SshdHost(n, f"127.0.0.{i + 2}", work / "hosts" / n, key).start() for i, n in enumerate(names)]
    cloud = CloudProcess(work / "cloud", free_port())
    try:
        access_key = provider_key(cloud)
        config = work / "conf" / "config-sample.conf"
        config.parent.mkdir()
        config.write_text("name: bench-cpod\n" + config_text(hosts, key))
        artifact = make_artifact(work / "artifact")
        agent = AgentProcess(
            cloud.url, work / "agent", access_key, "--name", "bench-cpod", "--heartbeat-interval", "0.5"
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "src"),
            "NO_COLOR": "1",
            "COLUMNS": "200",
            "SXWL_3KCTL_FAKE_KK": str(work / "records" / "kk"),
            "SXWL_3KCTL_FAKE_KUBE": str(work / "records" / "kube"),
            "SXWL_3KCTL_POLL_INTERVAL": "0.2",
        }
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "sxwl.ctl", "deploy", "all", f"--access-key={access_key}", "--cloud",
                 cloud.url, "-f", str(config), "--artifact", str(artifact), "--wait-timeout", "120"],
                env=env, capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
        finally:
            agent.stop()
        wall = time.monotonic() - start
    finally:
        cloud.stop()
        for host in hosts:
            host.stop()
    if proc.returncode != 0:
        raise SystemExit(f"deploy all failed:\n{proc.stdout}\n{proc.stderr}")
    steps = {m.group(1): float(m.group(2)) for m in map(STEP.search, proc.stdout.splitlines()) if m}
    return wall, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cold", action="store_true", help="also build from empty caches (minutes)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.cold:
            cold_env = {**env, "GOCACHE": str(work / "gocache")}
            wall, parts, _ = build(work / "cold.tgz", cold_env, "--cache", str(work / "cache"))
            rows.append(("cold", wall, parts))
        first = build(work / "a.tgz", env)
        second = build(work / "b.tgz", env)
        rows += [("warm", first[0], first[1]), ("warm again", second[0], second[1])]
        by_part = sizes(work / "a.tgz")
        compressed = (work / "a.tgz").stat().st_size
        same = first[2] == second[2]
        deploy = deploy_steps(work / "deploy") if have_sshd() else None
    names = list(dict.fromkeys(name for _, _, parts in rows for name in parts))
    lines = [
        f"## {utc_now()} — `make artifact` (bench/artifact.py)",
        "",
        machine_line(),
        f"- 1-minute load average before the run: {load_before:.2f} (other work on the machine skews times)",
        f"- archive: {compressed / 1e6:.1f} MB compressed; two warm builds "
        + ("gave the same sha256" if same else f"DIFFERED: {first[2]} / {second[2]}"),
        "",
        "| part | bytes (uncompressed) |",
        "|---|--:|",
        *(f"| {part} | {size:,} |" for part, size in by_part.items()),
        "",
        "| build | wall s | " + " | ".join(names) + " |",
        "|---|--:|" + "--:|" * len(names),
        *(
            f"| {label} | {wall:.1f} | " + " | ".join(f"{parts.get(n, 0):.1f}" for n in names) + " |"
            for label, wall, parts in rows
        ),
        "",
    ]
    if deploy is None:
        lines += ["`deploy all` not measured: needs root, /usr/sbin/sshd and unshare.", ""]
    else:
        lines += [
            f"`3kctl deploy all` against the stood-in cluster: {deploy[0]:.1f} s wall (the CLI's start and "
            "the accessKey check included)",
            "",
            "| step | s |",
            "|---|--:|",
            *(f"| {step} | {took:.1f} |" for step, took in deploy[1].items()),
            "",
        ]
    section = "\n".join(lines)
    print(section)
    append_results(section)


if __name__ == "__main__":
    main()
