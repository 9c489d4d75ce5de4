"""The NVML reader: the real library where a GPU exists, a stand-in with NVML's API elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pynvml
import pytest

from sxwl.agent.inventory.nvml import NvmlReader, cuda_version, gfd_product_name


def real_gpu_count() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


HAS_GPU = real_gpu_count() > 0


class StandInError(Exception):
    pass


@dataclass
class Device:
    name: str
    total_mib: int
    used_mib: int
    util: int
    temp: int


class StandInNvml:
    """The subset of pynvml the reader calls, over a list of devices; records every call."""

    NVMLError = StandInError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[Device], fail_init: bool = False) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.fail_init:
            raise StandInError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h].name.encode()  # older pynvml versions return bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:04d}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        d = self.devices[h]
        return SimpleNamespace(total=d.total_mib * 1024 * 1024, used=d.used_mib * 1024 * 1024)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.devices[h].util)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self.devices[h].temp

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040


def test_names_and_versions_are_formatted_like_gpu_feature_discovery() -> None:
    assert gfd_product_name("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert gfd_product_name("NVIDIA H200") == "NVIDIA-H200"
    assert cuda_version(12040) == "12.4"
    assert cuda_version(11080) == "11.8"


@pytest.mark.skipif(HAS_GPU, reason="a real GPU is present; the real-library test covers the reader")
def test_reader_against_a_stand_in() -> None:
    nvml = StandInNvml([Device("NVIDIA H200", 143771, 1024 * i, 10 * i, 30 + i) for i in range(4)])
    reader = NvmlReader(nvml)
    gpu = reader.read()
    assert gpu is not None
    assert (gpu.vendor, gpu.product, gpu.memory_mib, gpu.count, gpu.allocatable, gpu.used) == (
        "nvidia",
        "NVIDIA-H200",
        143771,
        4,
        4,
        0,
    )
    assert (gpu.driver, gpu.cuda) == ("550.54.15", "12.4")
    assert [(d.index, d.utilization_pct, d.memory_used_mib, d.temperature_c) for d in gpu.devices] == [
        (0, 0, 0, 30),
        (1, 10, 1024, 31),
        (2, 20, 2048, 32),
        (3, 30, 3072, 33),
    ]
    reader.read()
    assert nvml.calls.count("nvmlInit") == 1  # initialised once, not per heartbeat
    reader.close()
    assert nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.skipif(HAS_GPU, reason="a real GPU is present")
def test_mixed_machine_reports_its_most_numerous_product() -> None:
    devices = [Device("NVIDIA A100-SXM4-80GB", 81920, 0, 0, 40)] * 3 + [Device("NVIDIA T4", 15360, 0, 0, 40)]
    gpu = NvmlReader(StandInNvml(devices)).read()
    assert gpu is not None and (gpu.product, gpu.count, len(gpu.devices)) == ("NVIDIA-A100-SXM4-80GB", 3, 4)


@pytest.mark.skipif(HAS_GPU, reason="a real GPU is present")
def test_no_driver_and_no_devices_mean_no_gpu() -> None:
    assert NvmlReader(StandInNvml([], fail_init=True)).read() is None
    assert NvmlReader(StandInNvml([])).read() is None


def test_real_library_on_this_machine() -> None:
    gpu = NvmlReader().read()
    if HAS_GPU:
        assert gpu is not None and gpu.count >= 1 and gpu.memory_mib > 0 and gpu.driver
    else:
        assert gpu is None
