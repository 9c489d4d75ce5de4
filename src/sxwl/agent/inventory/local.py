"""The inventory of the one machine a ``local`` CPod is."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from sxwl.agent.inventory.nvml import NvmlReader
from sxwl.protocol import GpuInfo, Node


class GpuReader(Protocol):
    def read(self) -> GpuInfo | None: ...

    def close(self) -> None: ...


def memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


class LocalInventory:
    def __init__(self, gpus: GpuReader | None = None, node_name: str | None = None) -> None:
        self.gpus: GpuReader = gpus or NvmlReader()
        self.node_name = node_name or socket.gethostname()

    def gpu_indexes(self) -> list[int]:
        gpu = self.gpus.read()
        return [d.index for d in gpu.devices] if gpu else []

    def nodes(self) -> list[Node]:
        return [
            Node(
                name=self.node_name,
                status="ready",
                cpu_cores=os.cpu_count() or 1,
                memory_mib=memory_mib(),
                gpu=self.gpus.read(),
            )
        ]

    def close(self) -> None:
        self.gpus.close()
