"""What a real kubelet and containerd change on the host, recorded before they start and put back
after they stop (docs/k8s-testing.md, "Real nodes"): the sysctls the kubelet and the CNI bridge set,
the firewall (the kubelet's KUBE-* chains), network links and namespaces, mounts under the nodes'
roots, the kubepods cgroups of every cgroup v1 hierarchy, and the state folders the CNI plugins and
containerd's shims use outside any root we can give them.

`HostState.capture()` is a comparable snapshot; `HostRestorer` holds the one taken before the start
and undoes the differences. Both only touch what appeared after the snapshot, never other things.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The kubelet's setupKernelTunables, and what the bridge plugin's isGateway turns on.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv6/conf/all/forwarding",
)
# Folders the CNI plugins (libcni's cache, host-local's store), containerd (shim sockets, netns) and
# the kubelet (legacy container log links) write outside the roots a test gives them.
STATE_PATHS = (
    "/var/lib/cni",
    "/var/lib/kubelet",  # the device plugin socket's folder is fixed, whatever the kubelet's root dir
    "/run/containerd",
    "/run/netns",
    "/var/log/containers",
    "/var/log/pods",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Top-level cgroups the nodes make: the kubelet's "kubepods" under the default root, and the cgroup
# root of each node (tests/support/k8s_node_net.py).
CGROUP_PREFIXES = ("kubepods", "sxwl-real-")
_COUNTERS = re.compile(r"\[\d+:\d+\]")  # iptables-save's [packets:bytes]
_NFT_COUNTERS = re.compile(r"counter packets \d+ bytes \d+")


def _run(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=60).stdout


def _firewall() -> str:
    """Both iptables views (counters dropped) and, where nft is the backend, the nft ruleset."""
    parts = [_COUNTERS.sub("", _run(cmd)) for cmd in ("iptables-save", "ip6tables-save")]
    parts = ["\n".join(line for line in part.splitlines() if not line.startswith("#")) for part in parts]
    if shutil.which("nft"):
        # Counters of rules that were there before (a killed session's chains) move on their own.
        parts.append(_NFT_COUNTERS.sub("counter", _run("nft", "list", "ruleset")))
    return "\n".join(parts)


def _mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def _cgroups() -> list[str]:
    found = []
    for hierarchy in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
        if hierarchy.is_symlink() or not hierarchy.is_dir():
            continue
        for top in hierarchy.iterdir():
            if top.is_dir() and top.name.startswith(CGROUP_PREFIXES):
                found += [str(p) for p in [top, *top.rglob("*")] if p.is_dir()]
    return sorted(found)


def _tree(path: str) -> list[str]:
    root = Path(path)
    if not root.exists():
        return []
    return sorted(str(p) for p in [root, *root.rglob("*")])


@dataclass(frozen=True)
class HostState:
    sysctls: dict[str, str]
    firewall: str
    links: list[str]
    netns: list[str]
    mounts: list[str]
    cgroups: list[str]
    state_paths: list[str]

    @classmethod
    def capture(cls) -> HostState:
        sysctls = {}
        for name in SYSCTLS:
            path = Path("/proc/sys") / name
            if path.exists():
                sysctls[name] = path.read_text().strip()
        links = sorted(
            line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link").splitlines()
        )
        netns = sorted(line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip())
        return cls(
            sysctls=sysctls,
            firewall=_firewall(),
            links=links,
            netns=netns,
            mounts=_mounts(),
            cgroups=_cgroups(),
            state_paths=[p for path in STATE_PATHS for p in _tree(path)],
        )

    def differences(self, other: HostState) -> list[str]:
        """What differs from `other`, one line per kind, for assertion messages."""
        out = []
        for kind in ("sysctls", "links", "netns", "mounts", "cgroups", "state_paths"):
            mine, theirs = getattr(self, kind), getattr(other, kind)
            if mine != theirs:
                if isinstance(mine, dict):
                    out.append(f"{kind}: {mine} -> {theirs}")
                else:
                    added, gone = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
                    out.append(f"{kind}: added {added}, gone {gone}")
        if self.firewall != other.firewall:
            out.append(f"firewall:\n--- before\n{self.firewall}\n--- after\n{other.firewall}")
        return out


class HostRestorer:
    """Undoes, after the nodes stopped, what changed since `before` was captured."""

    def __init__(self, before: HostState, roots: list[Path]) -> None:
        self.before = before
        self.roots = roots
        self._saved_iptables = {cmd: _run(cmd) for cmd in ("iptables-save", "ip6tables-save")}
        self._saved_nft = {table: _run("nft", "list", "table", *table.split()) for table in _nft_tables()}

    def restore(self) -> list[str]:
        """Puts the host back; returns what could not be undone (empty when all went well)."""
        problems: list[str] = []
        self._unmount(problems)
        self._netns(problems)
        self._links(problems)
        self._firewall(problems)
        self._sysctls(problems)
        self._cgroups(problems)
        self._state_paths()
        return problems

    def _unmount(self, problems: list[str]) -> None:
        prefixes = [str(root.resolve()) + "/" for root in self.roots]
        old = set(self.before.mounts)
        for point in reversed(_mounts()):  # deepest (latest) first
            if point in old:
                continue
            # `ip netns add` also bind-mounts /run/netns onto itself (to share it).
            netns = point == "/run/netns" or point.startswith("/run/netns/")
            if netns or any(point.startswith(p) for p in prefixes):
                result = subprocess.run(["umount", "-l", point], capture_output=True, text=True, check=False)
                if result.returncode != 0:
                    problems.append(f"umount {point}: {result.stderr.strip()}")

    def _netns(self, problems: list[str]) -> None:
        for name in set(HostState.capture().netns) - set(self.before.netns):
            result = subprocess.run(
                ["ip", "netns", "delete", name], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                problems.append(f"ip netns delete {name}: {result.stderr.strip()}")

    def _links(self, problems: list[str]) -> None:
        old = set(self.before.links)
        for name in HostState.capture().links:
            if name not in old:
                # A veth goes with its peer: "Cannot find device" for the second of a pair is fine.
                result = subprocess.run(
                    ["ip", "link", "delete", name], capture_output=True, text=True, check=False
                )
                if result.returncode != 0 and "Cannot find device" not in result.stderr:
                    problems.append(f"ip link delete {name}: {result.stderr.strip()}")

    def _firewall(self, problems: list[str]) -> None:
        if shutil.which("nft") and "nf_tables" in _run("iptables", "--version"):
            for table in _nft_tables():
                if table not in self._saved_nft:
                    _check(problems, ["nft", "delete", "table", *table.split()])
                elif _run("nft", "list", "table", *table.split()) != self._saved_nft[table]:
                    _check(problems, ["nft", "delete", "table", *table.split()])
                    _check(problems, ["nft", "-f", "-"], self._saved_nft[table])
            return
        for cmd, saved in self._saved_iptables.items():
            restore = cmd.replace("-save", "-restore")
            tables = set(re.findall(r"^\*(\w+)", saved, re.M))
            for table in set(re.findall(r"^\*(\w+)", _run(cmd), re.M)) - tables:
                _check(problems, [restore.replace("-restore", ""), "-t", table, "-F"])
                _check(problems, [restore.replace("-restore", ""), "-t", table, "-X"])
            if saved:
                _check(problems, [restore], saved)

    def _sysctls(self, problems: list[str]) -> None:
        for name, value in self.before.sysctls.items():
            path = Path("/proc/sys") / name
            if path.read_text().strip() != value:
                try:
                    path.write_text(value)
                except OSError as error:
                    problems.append(f"sysctl {name}={value}: {error}")

    def _cgroups(self, problems: list[str]) -> None:
        old = set(self.before.cgroups)
        for path in sorted(_cgroups(), key=len, reverse=True):  # deepest first
            if path not in old:
                try:
                    Path(path).rmdir()
                except OSError as error:
                    problems.append(f"rmdir {path}: {error}")

    def _state_paths(self) -> None:
        old = set(self.before.state_paths)
        for path in STATE_PATHS:
            if path not in old:
                shutil.rmtree(path, ignore_errors=True)
                continue
            for entry in sorted(_tree(path), key=len, reverse=True):
                if entry not in old:
                    target = Path(entry)
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target, ignore_errors=True)
                    else:
                        target.unlink(missing_ok=True)


def _nft_tables() -> list[str]:
    """`nft list tables` as "family name" strings."""
    if not shutil.which("nft"):
        return []
    return [
        line.removeprefix("table ").strip() for line in _run("nft", "list", "tables").splitlines() if line
    ]


def _check(problems: list[str], args: list[str], stdin: str | None = None) -> None:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        problems.append(f"{' '.join(args)}: {result.stderr.strip()}")
