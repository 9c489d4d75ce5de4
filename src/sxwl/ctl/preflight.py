"""``3kctl preflight``: every host checked in parallel with one SSH command that gathers facts;
the checks are then judged here, each giving ✓ / ⚠ / ✗ with a fix for every ✗."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sxwl.ctl.cluster import ClusterConfig, Host
from sxwl.ctl.ssh import RunResult, SshPool

Status = Literal["ok", "warn", "fail", "skip"]
SYMBOL = {"ok": "✓", "warn": "⚠", "fail": "✗", "skip": "-"}

CHECKS = (
    "reachable",
    "os",
    "arch",
    "sudo",
    "cpu",
    "memory",
    "disk",
    "hostname",
    "machine-id",
    "clock",
    "swap",
    "modules",
    "ports",
    "nvidia",
    "runtime",
)

# Distributions KubeKey supports for the offline install (ID → versions; None: any).
SUPPORTED_OS: dict[str, tuple[str, ...] | None] = {
    "ubuntu": ("18.04", "20.04", "22.04", "24.04"),
    "debian": ("10", "11", "12"),
    "centos": ("7", "8"),
    "rhel": ("7", "8", "9"),
    "rocky": ("8", "9"),
    "almalinux": ("8", "9"),
    "openEuler": None,
    "kylin": None,
}
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
MODULES = ("overlay", "br_netfilter")
DISK_PATHS = ("/", "/var/lib", "/opt")
GIB = 1024 * 1024  # in KiB
ROLE_PORTS = {"control-plane": (6443, 10257, 10259), "etcd": (2379, 2380)}
ALL_PORTS = (10250,)
CLOCK_WARN_S = 0.5
CLOCK_FAIL_S = 2.0

# POSIX sh, read-only, no root needed (sudo is only tried). One line per fact: key=value. Written to
# fork little (shell builtins, one awk per file group): with many hosts the hosts' CPUs do the work,
# but on a loaded host every process counts.
FACTS_SCRIPT = r"""
export LC_ALL=C
if [ -r /etc/os-release ]; then . /etc/os-release; fi
echo "os_id=${ID:-unknown}"; echo "os_version=${VERSION_ID:-}"; echo "os_name=${PRETTY_NAME:-unknown}"
set -- $(uname -m -r); echo "kernel=$1"; echo "arch=$2"
h=; read -r h < /proc/sys/kernel/hostname; echo "hostname=$h"
m=; [ -r /etc/machine-id ] && read -r m < /etc/machine-id; echo "machine_id=$m"
u=$(id -u); echo "uid=$u"
if [ "$u" != 0 ]; then
  if sudo -n true 2>/dev/null; then echo sudo=ok; else echo sudo=fail; fi
fi
echo "cpus=$(getconf _NPROCESSORS_ONLN)"
awk 'FILENAME=="/proc/meminfo" && /^MemTotal:/ {print "mem_kib="$2}
     FILENAME=="/proc/swaps" && FNR>1 {print "swap="$1" "$3}
     FILENAME ~ /^\/proc\/net\/tcp/ && $4=="0A" {
       split($2,a,":"); if (!(a[2] in seen)) {seen[a[2]]; print "listen="a[2]}
     }' \
  /proc/meminfo /proc/swaps /proc/net/tcp /proc/net/tcp6 2>/dev/null
paths=; for p in __DISK_PATHS__; do [ -e "$p" ] && paths="$paths $p"; done
df -Pk $paths 2>/dev/null |
  awk -v paths="$paths" 'BEGIN{n=split(paths,p," ")} NR>1 && NR-1<=n {print "disk="p[NR-1]" "$4" "$6}'
for mod in __MODULES__; do
  if [ -d "/sys/module/$mod" ]; then echo "module=$mod loaded"
  elif grep -q "^$mod " /proc/modules 2>/dev/null; then echo "module=$mod loaded"
  elif modinfo "$mod" >/dev/null 2>&1; then echo "module=$mod available"
  else echo "module=$mod missing"; fi
done
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits 2>&1)
  echo "nvidia_rc=$?"; printf '%s\n' "$out" | sed 's/^/nvidia=/'
else
  echo "nvidia_rc=absent"
fi
for r in containerd docker crio; do
  if command -v "$r" >/dev/null 2>&1; then
    state=unknown; command -v systemctl >/dev/null 2>&1 && state=$(systemctl is-active "$r" 2>/dev/null)
    echo "runtime=$r ${state:-unknown}"
  fi
done
echo "time=$(date +%s.%N)"
""".replace("__DISK_PATHS__", " ".join(DISK_PATHS)).replace("__MODULES__", " ".join(MODULES))


@dataclass
class Check:
    status: Status
    detail: str
    fix: str = ""


@dataclass
class HostReport:
    host: str
    roles: list[str]
    checks: dict[str, Check] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks.values())


@dataclass
class Report:
    hosts: list[HostReport]
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(h.failed for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": list(CHECKS),
            "hosts": {
                h.host: {"roles": h.roles, "checks": {k: asdict(c) for k, c in h.checks.items()}}
                for h in self.hosts
            },
        }

    def failures(self) -> list[tuple[str, str, Check]]:
        return [(h.host, name, c) for h in self.hosts for name, c in h.checks.items() if c.status == "fail"]


def parse_facts(output: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "swap": [],
        "disk": [],
        "module": {},
        "listen": set(),
        "nvidia": [],
        "runtime": {},
    }
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "swap":
            facts["swap"].append(value)
        elif key == "disk":
            path, free, mount = [*value.split(), "", "", ""][:3]
            facts["disk"].append((path, int(free) if free.isdigit() else 0, mount))
        elif key == "module":
            name, _, state = value.partition(" ")
            facts["module"][name] = state
        elif key == "listen":
            try:
                facts["listen"].add(int(value, 16))
            except ValueError:
                continue
        elif key == "nvidia":
            facts["nvidia"].append(value)
        elif key == "runtime":
            name, _, state = value.partition(" ")
            facts["runtime"][name] = state
        else:
            facts[key] = value
    return facts


def judge(config: ClusterConfig, host: Host, facts: dict[str, Any], skew: float | None) -> dict[str, Check]:
    roles = config.roles_of(host.name)
    checks: dict[str, Check] = {"reachable": Check("ok", f"{host.user}@{host.address}:{host.port}")}

    os_id, version = facts.get("os_id", "unknown"), facts.get("os_version", "")
    versions = SUPPORTED_OS.get(os_id, ())
    if versions is None or (versions and version in versions):
        checks["os"] = Check("ok", facts.get("os_name", os_id))
    elif os_id in SUPPORTED_OS:
        checks["os"] = Check("warn", f"{facts.get('os_name')}: version not tested with this artifact")
    else:
        checks["os"] = Check(
            "warn", f"{facts.get('os_name', os_id)}: not a distribution this tool was tested on"
        )

    machine = facts.get("arch", "?")
    arch = ARCHES.get(machine)
    if arch is None:
        checks["arch"] = Check(
            "fail", f"{machine} is not supported", "use amd64 (x86_64) or arm64 (aarch64) servers"
        )
    elif arch != host.arch:
        checks["arch"] = Check(
            "fail",
            f"{machine}, but the config says {host.arch}",
            f"set `arch: {arch}` for {host.name} in the config",
        )
    else:
        checks["arch"] = Check("ok", machine)

    if facts.get("uid") == "0":
        checks["sudo"] = Check("ok", "root")
    elif facts.get("sudo") == "ok":
        checks["sudo"] = Check("ok", f"{host.user} may sudo")
    else:
        checks["sudo"] = Check(
            "fail",
            f"{host.user} cannot sudo without a password",
            f"add `{host.user} ALL=(ALL) NOPASSWD: ALL` to /etc/sudoers.d/3kctl on {host.name}, or "
            "log in as root",
        )

    cpus = int(facts.get("cpus") or 0)
    needs_two = bool({"control-plane", "etcd"} & set(roles))
    if cpus < 2 and needs_two:
        checks["cpu"] = Check("fail", f"{cpus} CPU", "control-plane and etcd hosts need at least 2 CPUs")
    elif cpus < 4 and "worker" in roles:
        checks["cpu"] = Check("warn", f"{cpus} CPUs: few for a GPU worker")
    else:
        checks["cpu"] = Check("ok", f"{cpus} CPUs")

    mem_gib = int(facts.get("mem_kib") or 0) / GIB
    if mem_gib < 1.7:
        checks["memory"] = Check("fail", f"{mem_gib:.1f} GiB", "Kubernetes needs at least 2 GiB of memory")
    elif mem_gib < 8 and "worker" in roles:
        checks["memory"] = Check("warn", f"{mem_gib:.1f} GiB: little for training jobs")
    else:
        checks["memory"] = Check("ok", f"{mem_gib:.1f} GiB")

    checks["disk"] = judge_disk(facts["disk"], roles)

    checks["swap"] = (
        Check(
            "fail", f"swap on: {', '.join(facts['swap'])}", "run `swapoff -a` and remove swap from /etc/fstab"
        )
        if facts["swap"]
        else Check("ok", "off")
    )

    checks["modules"] = judge_modules(facts["module"])
    checks["ports"] = judge_ports(facts["listen"], roles)
    checks["nvidia"] = judge_nvidia(facts, "worker" in roles)
    checks["runtime"] = judge_runtime(facts["runtime"])

    if skew is None:
        checks["clock"] = Check("warn", "could not read the host's time")
    elif abs(skew) > CLOCK_FAIL_S:
        checks["clock"] = Check(
            "fail",
            f"{skew:+.1f}s off this machine",
            "enable time sync on every host (chrony or `timedatectl set-ntp true`)",
        )
    elif abs(skew) > CLOCK_WARN_S:
        checks["clock"] = Check("warn", f"{skew:+.2f}s off this machine: enable time sync")
    else:
        checks["clock"] = Check("ok", f"{skew:+.2f}s")
    return checks


def judge_disk(disks: list[tuple[str, int, str]], roles: list[str]) -> Check:
    seen: dict[str, tuple[str, int]] = {}
    for path, free, mount in disks:
        seen.setdefault(mount, (path, free))
    if not seen:
        return Check("warn", "could not read free disk space")
    smallest_path, smallest = min(seen.values(), key=lambda v: v[1])
    summary = ", ".join(f"{p} {f / GIB:.0f} GiB" for p, f in seen.values())
    if smallest < 10 * GIB:
        return Check(
            "fail",
            f"{smallest_path}: {smallest / GIB:.1f} GiB free",
            f"free space on {smallest_path}: images and etcd need at least 10 GiB (50 GiB recommended)",
        )
    wanted = 100 if "registry" in roles else 50
    if smallest < wanted * GIB:
        return Check("warn", f"{summary}: {wanted} GiB recommended")
    return Check("ok", summary)


def judge_modules(modules: dict[str, str]) -> Check:
    missing = [m for m in MODULES if modules.get(m, "missing") == "missing"]
    available = [m for m in MODULES if modules.get(m) == "available"]
    if missing:
        return Check(
            "fail",
            f"kernel lacks {', '.join(missing)}",
            f"install the kernel's module package (e.g. linux-modules-extra-$(uname -r)) so that "
            f"`modprobe {' '.join(missing)}` works",
        )
    if available:
        return Check("warn", f"{', '.join(available)} not loaded (KubeKey loads them)")
    return Check("ok", ", ".join(MODULES))


def judge_ports(listening: set[int], roles: list[str]) -> Check:
    wanted = list(ALL_PORTS)
    for role in roles:
        wanted.extend(ROLE_PORTS.get(role, ()))
    busy = sorted(p for p in set(wanted) if p in listening)
    if busy:
        ports = ", ".join(map(str, busy))
        return Check(
            "fail",
            f"in use: {ports}",
            f"stop what listens on {ports} (`ss -ltnp` shows it); a host of an old cluster needs "
            "`kubeadm reset`",
        )
    return Check("ok", ", ".join(str(p) for p in sorted(set(wanted))) + " free")


def judge_nvidia(facts: dict[str, Any], worker: bool) -> Check:
    if not worker:
        return Check("skip", "not a worker")
    rc = facts.get("nvidia_rc")
    if rc == "absent":
        return Check("warn", "no NVIDIA driver (nvidia-smi not found): this worker joins without GPUs")
    lines = [line for line in facts["nvidia"] if line.strip()]
    if rc != "0":
        return Check(
            "fail",
            f"nvidia-smi fails: {lines[0] if lines else 'exit ' + str(rc)}",
            "repair the NVIDIA driver (reinstall it, or reboot after an upgrade) until `nvidia-smi` works",
        )
    if not lines:
        return Check("warn", "driver present but no GPU found")
    products = Counter(line.split(",")[0].strip() for line in lines)
    driver = lines[0].split(",")[-1].strip()
    return Check("ok", ", ".join(f"{n}× {p}" for p, n in products.items()) + f", driver {driver}")


def judge_runtime(runtimes: dict[str, str]) -> Check:
    active = [name for name, state in runtimes.items() if state == "active"]
    if "docker" in active:
        return Check(
            "warn", "Docker is running: KubeKey configures containerd; stop Docker's containers first"
        )
    if active:
        return Check("warn", f"{', '.join(active)} already running: KubeKey reuses and reconfigures it")
    if runtimes:
        return Check("ok", f"{', '.join(runtimes)} installed, not running")
    return Check("ok", "none (KubeKey installs containerd)")


def unreachable(config: ClusterConfig, host: Host, result: RunResult) -> HostReport:
    report = HostReport(host.name, config.roles_of(host.name))
    fix = "see the message; `3kctl ssh setup` installs the key"
    if result.error and "HOST KEY CHANGED" in result.error:
        fix = "if the server was reinstalled, delete its line from the work dir's known_hosts"
    elif result.error and result.error.startswith(("unreachable", "connection refused", "cannot resolve")):
        fix = "check the address, that sshd runs on that port, and the firewall"
    report.checks["reachable"] = Check("fail", result.why(), fix)
    for name in CHECKS[1:]:
        report.checks[name] = Check("skip", "not reachable")
    return report


async def check_host(pool: SshPool, config: ClusterConfig, host: Host) -> HostReport:
    sent = time.time()
    result = await pool.run(host, FACTS_SCRIPT, sudo=False, timeout=60)
    received = time.time()
    if not result.ok:
        return unreachable(config, host, result)
    facts = parse_facts(result.stdout)
    skew = None
    try:
        skew = float(facts["time"]) - (sent + received) / 2
        # The one command also covered connection set-up, so only skews beyond the round trip count.
        if abs(skew) <= (received - sent) / 2:
            skew = 0.0
    except (KeyError, ValueError):
        pass
    report = HostReport(host.name, config.roles_of(host.name), facts=facts)
    report.checks = judge(config, host, facts, skew)
    return report


def cross_checks(config: ClusterConfig, reports: Iterable[HostReport]) -> None:
    """Checks that compare hosts: hostnames and machine ids unique, hostnames as configured."""
    reachable = [r for r in reports if r.checks["reachable"].status == "ok"]
    by_hostname: dict[str, list[str]] = {}
    by_machine: dict[str, list[str]] = {}
    for r in reachable:
        by_hostname.setdefault(r.facts.get("hostname", ""), []).append(r.host)
        if r.facts.get("machine_id"):
            by_machine.setdefault(r.facts["machine_id"], []).append(r.host)
    for r in reachable:
        hostname = r.facts.get("hostname", "")
        twins = [h for h in by_hostname[hostname] if h != r.host]
        if twins:
            r.checks["hostname"] = Check(
                "fail",
                f"{hostname!r}, the same as {', '.join(twins)}",
                "if these are one server, list it once; else give each its own hostname "
                "(`hostnamectl set-hostname NAME`)",
            )
        elif hostname != r.host:
            r.checks["hostname"] = Check("warn", f"{hostname!r}: KubeKey renames it to {r.host!r}")
        else:
            r.checks["hostname"] = Check("ok", hostname)
        machine_id = r.facts.get("machine_id", "")
        same = [h for h in by_machine.get(machine_id, []) if h != r.host]
        if not machine_id:
            r.checks["machine-id"] = Check("warn", "no /etc/machine-id")
        elif same:
            r.checks["machine-id"] = Check(
                "fail",
                f"same /etc/machine-id as {', '.join(same)}",
                "servers cloned from one image: run `rm /etc/machine-id && systemd-machine-id-setup` "
                "on each clone",
            )
        else:
            r.checks["machine-id"] = Check("ok", machine_id[:8] + "…")
    for r in reachable:
        r.checks = {name: r.checks[name] for name in CHECKS if name in r.checks}


async def run_preflight(pool: SshPool, config: ClusterConfig, hosts: list[Host] | None = None) -> Report:
    started = time.monotonic()
    chosen = hosts if hosts is not None else config.cluster_hosts
    reports = await pool.each(chosen, lambda h: check_host(pool, config, h))
    ordered = [reports[h.name] for h in chosen]
    cross_checks(config, ordered)
    return Report(ordered, time.monotonic() - started)
