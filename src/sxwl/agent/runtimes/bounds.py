"""What bounds each attempt on a local CPod (docs/agent.md, "Bounds (local runtime)"): its memory,
its CPU time (the cores a dev environment asked for) and its number of processes (a cgroup of its
own, and RLIMIT_NPROC on its own uid), the size of its
private /tmp and /dev/shm, and its network (a namespace of its own: loopback only, or outbound
through slirp4netns)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

JobNetwork = Literal["loopback", "outbound"]

DEFAULT_MEMORY = "80%"  # of the machine's memory, for each attempt: the agent and the host keep the rest
DEFAULT_TMPFS = "25%"  # each of /tmp and /dev/shm (the kernel's own default is 50 %, per mount)
DEFAULT_PIDS = 8192  # processes and threads: a data loader's workers times their threads fit

_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>Ki|Mi|Gi|Ti|k|M|G|T|%)?")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS.update({f"{p}i": 2 ** (10 * n) for n, p in enumerate("KMGT", start=1)})


@dataclass(frozen=True)
class JobBounds:
    memory_bytes: int | None = None  # None: no memory bound
    pids: int | None = None  # None: no bound on processes
    tmpfs_bytes: int | None = None  # each of /tmp and /dev/shm; None: the kernel's default
    network: JobNetwork = "loopback"
    cpus: int | None = None  # cores' worth of CPU time (a cgroup quota); None: no bound

    def for_attempt(self, cpus: int | None, memory_mib: int | None) -> JobBounds:
        """These bounds (the CPod's, from the agent's flags) narrowed to what one attempt asked for
        (``Assignment.cpus``, ``memory_mib``): its cores as a CPU quota, its memory where that is
        less than the CPod's own bound (which an attempt never raises)."""
        memory = self.memory_bytes
        if memory_mib is not None:
            asked = memory_mib * 2**20
            memory = asked if memory is None else min(memory, asked)
        return dataclasses.replace(self, memory_bytes=memory, cpus=cpus)

    def describe(self) -> str:
        """For the start-up log: the bounds as a provider set them."""

        def gib(n: int | None) -> str:
            if n is None:
                return "unbounded"
            return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"

        return (
            f"memory {gib(self.memory_bytes)}, processes {self.pids or 'unbounded'}, "
            f"/tmp and /dev/shm {gib(self.tmpfs_bytes)} each, network {self.network}"  # noqa: S108
        )


def machine_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The machine's memory in bytes (``MemTotal``)."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{meminfo} has no MemTotal")


def size(text: str, total: int) -> int | None:
    """``512Mi``, ``16Gi``, ``2G``, bytes, or a percentage of ``total``; ``0``: no bound (None)."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        raise ValueError(
            "expected a size such as 512Mi, 16Gi or 50% (of the machine's memory), or 0 for none"
        )
    number, unit = float(found["number"]), found["unit"] or ""
    value = int(total * number / 100) if unit == "%" else int(number * _UNITS[unit])
    if unit == "%" and number > 100:
        raise ValueError("a percentage of the machine's memory is at most 100%")
    if value == 0:
        if number != 0:
            raise ValueError("too small: less than a byte")
        return None
    return value
