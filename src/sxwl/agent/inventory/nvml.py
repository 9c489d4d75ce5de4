"""NVIDIA GPUs through NVML (nvidia-ml-py). A machine without the driver has no GPUs, not an error."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from sxwl.protocol import GpuDevice, GpuInfo

log = logging.getLogger("sxwl.agent.nvml")
MIB = 1024 * 1024


def gfd_product_name(name: str) -> str:
    """The product as GPU Feature Discovery labels it (``NVIDIA A100-SXM4-80GB`` →
    ``NVIDIA-A100-SXM4-80GB``), so local and Kubernetes CPods name GPUs alike."""
    return "-".join(name.split())


def cuda_version(encoded: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


class NvmlReader:
    """Reads NVIDIA GPUs. ``nvml`` is the pynvml module; a stand-in with the same functions can be
    given where no GPU exists."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._ready = False
        self._warned = False

    def _start(self) -> bool:
        if self._ready:
            return True
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            if not self._warned:
                log.info("no NVIDIA GPUs: NVML unavailable (%s)", exc)
                self._warned = True
            return False
        self._ready = True
        return True

    def read(self) -> GpuInfo | None:
        if not self._start():
            return None
        nv = self._nvml
        assert nv is not None
        try:
            count = nv.nvmlDeviceGetCount()
            if count == 0:
                return None
            devices = []
            products: Counter[tuple[str, int]] = Counter()
            for index in range(count):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                products[(gfd_product_name(_text(nv.nvmlDeviceGetName(handle))), memory.total // MIB)] += 1
                devices.append(
                    GpuDevice(
                        index=index,
                        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                        utilization_pct=nv.nvmlDeviceGetUtilizationRates(handle).gpu,
                        memory_used_mib=memory.used // MIB,
                        temperature_c=nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
                    )
                )
            (product, memory_mib), _ = products.most_common(1)[0]
            if len(products) > 1:
                # One node offers one product; a mixed machine reports its most numerous kind.
                log.warning("mixed GPU products %s; reporting %s", dict(products), product)
            return GpuInfo(
                vendor="nvidia",
                product=product,
                memory_mib=memory_mib,
                count=products[(product, memory_mib)],
                allocatable=products[(product, memory_mib)],
                used=0,
                driver=_text(nv.nvmlSystemGetDriverVersion()),
                cuda=cuda_version(nv.nvmlSystemGetCudaDriverVersion()),
                devices=devices,
            )
        except nv.NVMLError as exc:
            log.warning("reading GPUs through NVML failed: %s", exc)
            return None

    def close(self) -> None:
        if self._ready and self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._ready = False


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
