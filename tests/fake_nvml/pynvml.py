"""A stand-in for pynvml on a machine with two GPUs, answering as NVML does (names as bytes on one board, power
NotSupported on the other). Tests put this folder first on sys.path or PYTHONPATH (kernels, servers) so that
`import pynvml` finds it; nothing here touches a real GPU, so GPU listing and planning are tested anywhere.
"""

from __future__ import annotations

from collections import namedtuple

Memory = namedtuple("Memory", "total free used")
Utilization = namedtuple("Utilization", "gpu memory")
Process = namedtuple("Process", "pid usedGpuMemory")

NVML_TEMPERATURE_GPU = 0
GPU_COUNT = 2


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # pynvml's own names
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return GPU_COUNT


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-aaaa{handle}-1111"


def nvmlDeviceGetName(handle: int) -> str | bytes:
    return b"NVIDIA H100 80GB HBM3" if handle == 0 else "NVIDIA A100-SXM4-40GB"


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    return (9, 0) if handle == 0 else (8, 0)


def nvmlDeviceGetMemoryInfo(handle: int) -> Memory:
    return Memory(80 * 2**30, 70 * 2**30, 10 * 2**30)


def nvmlDeviceGetUtilizationRates(handle: int) -> Utilization:
    return Utilization(63 if handle == 0 else 0, 10)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return 41 + handle


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    if handle == 1:
        raise NVMLError_NotSupported("Not Supported")
    return 312_500


nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerUsage


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Process]:
    return [Process(4242, 2 * 2**30)] if handle == 0 else []


nvmlDeviceGetGraphicsRunningProcesses = nvmlDeviceGetComputeRunningProcesses


def nvmlSystemGetProcessName(pid: int) -> bytes:
    return b"python"
