"""The CPod a config file describes: its hosts, their roles and the cluster's settings, and the
problems found in the file (each with its line and column)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sxwl.ctl.errors import EXIT_USAGE, CtlError

DEFAULT_POD_CIDR = "10.233.64.0/18"
DEFAULT_SERVICE_CIDR = "10.233.0.0/18"
ROLE_GROUPS = ("etcd", "control-plane", "worker", "registry")
RANGE_RE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<a>\d+):(?P<b>\d+)\](?P<suffix>[^\[\]]*)$")
MAX_RANGE = 1000

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Mark:
    line: int  # 1-based
    column: int  # 1-based


@dataclass(frozen=True)
class Problem:
    severity: Severity
    message: str
    fix: str
    mark: Mark | None = None

    def render(self, path: Path | str, lines: list[str]) -> str:
        where = f"{path}:{self.mark.line}:{self.mark.column}" if self.mark else f"{path}"
        out = [f"{where}: {self.severity}: {self.message}"]
        if self.mark and 1 <= self.mark.line <= len(lines):
            text = lines[self.mark.line - 1].rstrip("\n").replace("\t", " ")
            gutter = f"{self.mark.line:>5} | "
            out.append(gutter + text)
            out.append(" " * (len(gutter) - 2) + "| " + " " * (self.mark.column - 1) + "^")
        if self.fix:
            out.append(f"  fix: {self.fix}")
        return "\n".join(out)


class ConfigInvalid(CtlError):
    """The config has errors; the message lists every problem (warnings too)."""

    def __init__(self, path: Path, problems: list[Problem], lines: list[str]) -> None:
        self.path = path
        self.problems = problems
        errors = sum(p.severity == "error" for p in problems)
        body = "\n\n".join(p.render(path, lines) for p in problems)
        super().__init__(
            f"{body}\n\n{path}: {errors} error{'s' if errors != 1 else ''}; "
            "fix them and run `3kctl check config` again",
            EXIT_USAGE,
        )


@dataclass
class Host:
    name: str
    internal_address: str
    address: str
    port: int = 22
    user: str = "root"
    private_key_path: Path | None = None
    password: str | None = field(default=None, repr=False)  # only for `3kctl ssh setup`; never logged
    arch: str = "amd64"
    line: int = 0

    @property
    def is_root(self) -> bool:
        return self.user == "root"

    def describe(self) -> str:
        return f"{self.name} ({self.user}@{self.internal_address}:{self.port})"


@dataclass
class ClusterConfig:
    path: Path
    text: str
    name: str
    hosts: list[Host]
    role_groups: dict[str, list[str]]
    ceph_devices: list[str] = field(default_factory=list)
    kubernetes_version: str | None = None
    pod_cidr: str = DEFAULT_POD_CIDR
    service_cidr: str = DEFAULT_SERVICE_CIDR
    warnings: list[Problem] = field(default_factory=list)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def roles_of(self, name: str) -> list[str]:
        return [role for role in ROLE_GROUPS if name in self.role_groups.get(role, [])]

    def members(self, role: str) -> list[Host]:
        return [self.host(n) for n in self.role_groups.get(role, [])]

    @property
    def control_planes(self) -> list[Host]:
        return self.members("control-plane")

    @property
    def workers(self) -> list[Host]:
        return self.members("worker")

    @property
    def registry(self) -> Host:
        return self.members("registry")[0]

    @property
    def cluster_hosts(self) -> list[Host]:
        """Hosts with at least one role, in file order."""
        return [h for h in self.hosts if self.roles_of(h.name)]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def work_dir(self) -> Path:
        return self.path.resolve().parent / ".3kctl"


def expand(member: str) -> list[str]:
    """``master[1:3]`` → master1, master2, master3; ``gpu[01:10]`` keeps the width (gpu01 …)."""
    match = RANGE_RE.match(member)
    if not match:
        return [member]
    a, b = match["a"], match["b"]
    start, end = int(a), int(b)
    if start > end:
        raise ValueError(f"range [{a}:{b}] counts down; write [{b}:{a}]")
    if end - start >= MAX_RANGE:
        raise ValueError(f"range [{a}:{b}] has more than {MAX_RANGE} names")
    width = len(a) if len(a) > 1 and a.startswith("0") else 0
    return [f"{match['prefix']}{i:0{width}d}{match['suffix']}" for i in range(start, end + 1)]
