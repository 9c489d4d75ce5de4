"""Declared GPUs for machines without any: for tests and demos of GPU scheduling. Every report
says ``vendor: simulated``, so nobody mistakes them for hardware."""

from __future__ import annotations

from sxwl.protocol import GpuDevice, GpuInfo


class SimulatedGpus:
    def __init__(self, count: int, product: str = "SIMULATED-GPU", memory_mib: int = 81920) -> None:
        self.count = count
        self.product = product
        self.memory_mib = memory_mib

    def read(self) -> GpuInfo | None:
        if self.count == 0:
            return None
        return GpuInfo(
            vendor="simulated",
            product=self.product,
            memory_mib=self.memory_mib,
            count=self.count,
            allocatable=self.count,
            devices=[GpuDevice(index=i) for i in range(self.count)],
        )

    def close(self) -> None:
        return None
