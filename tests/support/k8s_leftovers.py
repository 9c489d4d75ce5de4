"""What a test session killed before its teardown (SIGKILL, a CI timeout) leaves of its real nodes,
cleared by the next session before it starts its own (docs/k8s-testing.md, "Real nodes").

A killed session cannot run `RealNodes.stop()`: its kubelets, containerds and CoreDNS live on in
their own process groups, its pods in the nodes' cgroups, its network namespaces, veths and
cgroup roots keep the fixed names the next start needs, and its nodes' folder (about 17 GB of image
stores) stays in pytest's temp dir, which pytest keeps for three sessions: enough killed sessions
fill the disk. The next session clears them only while it
holds the host-wide lock, so nothing it removes belongs to a session that is still running.

Processes are recorded by pid and start time when spawned, so a pid the kernel reused since is left
alone; everything else is found by the names tests/support/k8s_node_net.py gives it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.k8s_host import CGROUP_ROOT
from tests.support.k8s_node_net import NodeNet

PIDS_FILE = Path("/tmp/sxwl-test-real-nodes.pids")
ROOTS_FILE = Path("/tmp/sxwl-test-real-nodes.roots")
# The kubelet links each container's log here, whatever its root; it removes a link whose log is
# gone in its own time, which would read as a change the next session's nodes made to the host.
LOG_LINKS = Path("/var/log/containers")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (after the parenthesised name, which may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def record_spawned(pid: int, *, pids_file: Path = PIDS_FILE) -> None:
    """Notes a process group the running session started (its leader's pid)."""
    started = _start_time(pid)
    if started is not None:
        with pids_file.open("a") as out:
            out.write(f"{pid} {started}\n")


def record_root(root: Path, *, roots_file: Path = ROOTS_FILE) -> None:
    """Notes the folder the running session's nodes keep their stores in."""
    with roots_file.open("a") as out:
        out.write(f"{root.resolve()}\n")


def forget_spawned(*, pids_file: Path = PIDS_FILE, roots_file: Path = ROOTS_FILE) -> None:
    """After a clean stop nothing is left to clear (the folder is its owner's to remove)."""
    pids_file.unlink(missing_ok=True)
    roots_file.unlink(missing_ok=True)


def clear_leftovers(
    nets: list[NodeNet],
    *,
    pids_file: Path = PIDS_FILE,
    roots_file: Path = ROOTS_FILE,
    log_links: Path = LOG_LINKS,
    firewall: bool = True,
) -> list[str]:
    """Stops a killed session's processes and removes its namespaces, links, cgroup roots, its
    nodes' folders with the log links into them and (with `firewall`) its kubelets' nft tables;
    returns what it cleared, one line each (empty on a clean host). Call it holding the lock."""
    cleared = _kill_recorded(pids_file)
    for net in nets:
        cleared += _kill_cgroup(net.cgroup_root)
        cleared += _delete_netns(net.netns)
        if _ip("link", "show", net.host_link).returncode == 0:
            _ip("link", "delete", net.host_link)
            cleared.append(f"link {net.host_link}")
        cleared += _remove_cgroup(net.cgroup_root)
    cleared += _remove_roots(roots_file, log_links)
    if firewall:
        cleared += _delete_kubelet_tables()
    forget_spawned(pids_file=pids_file, roots_file=roots_file)
    return cleared


def _remove_roots(roots_file: Path, log_links: Path) -> list[str]:
    """Removes the recorded folders, first unmounting what the killed containerds and kubelets left
    mounted inside them (containers' root filesystems, pods' volumes), deepest first, so that
    nothing is removed through a mount, and the kubelets' log links that point into them."""
    if not roots_file.exists():
        return []
    cleared = []
    for root in {Path(line) for line in roots_file.read_text().splitlines() if line.strip()}:
        links = [link for link in _links_in(log_links) if link.readlink().is_relative_to(root)]
        for link in links:
            link.unlink(missing_ok=True)
        if links:
            cleared.append(f"{len(links)} log links into {root}")
        for mount in sorted(_mounts_under(root), key=lambda m: -len(m.parts)):
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False, timeout=30)
        if root.is_dir() and not _mounts_under(root):
            size = sum(f.lstat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(root, ignore_errors=True)
            cleared.append(f"folder {root} ({size / 2**30:.1f} GiB)")
    return cleared


def _links_in(folder: Path) -> list[Path]:
    return [entry for entry in folder.iterdir() if entry.is_symlink()] if folder.is_dir() else []


def _mounts_under(root: Path) -> list[Path]:
    """Mount points at or below `root` (field 5 of /proc/self/mountinfo, octal escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if point == root or root in point.parents:
            points.append(point)
    return points


def _kill_recorded(pids_file: Path) -> list[str]:
    if not pids_file.exists():
        return []
    cleared = []
    for line in pids_file.read_text().splitlines():
        pid, started = line.split()
        if _start_time(int(pid)) == started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
                cleared.append(f"process group {pid}")
    return cleared


def _kill_cgroup(name: str) -> list[str]:
    """Kills every process under `/<name>` (the pods and their shims), in one v1 hierarchy: a process
    is in every hierarchy at once."""
    root = CGROUP_ROOT / "pids" / name
    pids = {int(pid) for procs in root.rglob("cgroup.procs") for pid in procs.read_text().split()}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"{len(pids)} processes in cgroup /{name}"] if pids else []


def _delete_netns(name: str) -> list[str]:
    if not Path("/run/netns", name).exists():
        return []
    pids = _ip("netns", "pids", name).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "delete", name)
    return [f"netns {name} ({len(pids)} processes)"]


def _remove_cgroup(name: str) -> list[str]:
    removed = False
    for hierarchy in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
        top = hierarchy / name
        if hierarchy.is_symlink() or not top.is_dir():
            continue
        # A cgroup whose processes were just killed empties a moment later; rmdir until it does.
        for path in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        removed = True
    return [f"cgroup root /{name}"] if removed else []


def _delete_kubelet_tables() -> list[str]:
    if not shutil.which("nft"):
        return []
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=False)
    cleared = []
    for table in kubelet_only_tables(ruleset.stdout):
        subprocess.run(["nft", "delete", "table", *table.split()], capture_output=True, check=False)
        cleared.append(f"nft table {table}")
    return cleared


def kubelet_only_tables(ruleset: str) -> list[str]:
    """The tables ("family name") of an `nft list ruleset` that hold the kubelet's chains (KUBE-*)
    and nothing else but base chains' jumps to them: what a kubelet that was never stopped left
    (a stopped one's are restored away, tests/support/k8s_host.py)."""
    tables: dict[str, dict[str, list[str]]] = {}
    table = chain = None
    for line in (raw.strip() for raw in ruleset.splitlines()):
        if line.startswith("table "):
            table = line.removeprefix("table ").removesuffix("{").strip()
            tables[table] = {}
        elif line.startswith("chain ") and table is not None:
            chain = line.removeprefix("chain ").removesuffix("{").strip()
            tables[table][chain] = []
        elif line == "}":
            if chain is not None:
                chain = None
            else:
                table = None
        elif line and table is not None and chain is not None and not line.startswith("type "):
            tables[table][chain].append(line)
    return [
        name
        for name, chains in tables.items()
        if any(chain.startswith("KUBE-") for chain in chains)
        and all(
            chain.startswith("KUBE-") or all("jump KUBE-" in rule for rule in rules)
            for chain, rules in chains.items()
        )
    ]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
