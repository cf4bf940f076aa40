"""The machine's GPUs (gpuDevice): what NVML reports about each, and which one the notebook uses.

`gpus()` never raises for a missing GPU, driver or NVML library: it returns an empty list whose `message` says
why, in one line. Indices are the ones CUDA and torch use in this process: with `CUDA_VISIBLE_DEVICES=2,3`,
GPU 0 is physical GPU 2 (`GpuInfo.nvml_index` keeps the physical one). NVML lists GPUs in PCI bus order; set
`CUDA_DEVICE_ORDER=PCI_BUS_ID` where a machine mixes GPU models so that CUDA counts them the same way.

Each GPU also lists its holders: the pools and in-notebook trainings of any user of the machine that reserved it
(nbscale.gpu_reservations). Training on a GPU in the notebook reserves it for this process (`training_gpu`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, overload

from nbscale.errors import GpuError
from nbscale.gpu_reservations import GpuHolder, GpuReservation, can_reserve, gpu_key, holders, reserve
from nbscale.rendering import Rendered
from nbscale.user_warnings import warn_user

NO_DRIVER = "No GPU: the NVIDIA driver was not found on this machine."
NO_NVML = "No GPU: nvidia-ml-py (pynvml) is not installed, so GPUs cannot be listed."
NO_DEVICE = "No GPU: the NVIDIA driver is loaded but sees no GPU."

_MIB = 1024 * 1024


@dataclass
class _Selection:
    index: int | None = None  # the index select_gpu() chose in this process


_selection = _Selection()
_training_reservations: dict[str, GpuReservation] = {}  # GPUs this process trained on, held until it exits


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (any user's; its name where the OS lets us read it)."""

    pid: int
    name: str | None
    memory_used_mb: float | None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it now. Memory in MiB (as nvidia-smi shows), power in watts; None where unsupported."""

    index: int
    nvml_index: int
    name: str
    compute_capability: str | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    utilization_percent: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    processes: tuple[GpuProcess, ...] = ()
    selected: bool = False
    uuid: str | None = None  # "GPU-...": names this GPU in CUDA_VISIBLE_DEVICES whatever CUDA_DEVICE_ORDER is
    holders: tuple[GpuHolder, ...] = ()  # who reserved it (any user's pools and trainings), oldest first

    @property
    def device_id(self) -> str:
        """This GPU in a worker's CUDA_VISIBLE_DEVICES: its UUID, else its NVML index."""
        return self.uuid or str(self.nvml_index)

    def held_by_others(self) -> tuple[GpuHolder, ...]:
        """Its holders other than this process."""
        return tuple(holder for holder in self.holders if not holder.this_process)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (processes as a list of dicts)."""
        return asdict(self)


class GpuList(Rendered, Sequence[GpuInfo]):
    """The GPUs of `gpus()`: a sequence of GpuInfo, shown as a table (HTML in notebooks, text elsewhere; the
    tables are nbscale.ui.gpu_table's).

    Empty when there is no GPU; `message` then says why in one line.
    """

    def __init__(self, items: Sequence[GpuInfo], message: str | None = None) -> None:
        self._items = tuple(items)
        self.message = message

    @overload
    def __getitem__(self, index: int) -> GpuInfo: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[GpuInfo, ...]: ...
    def __getitem__(self, index: int | slice) -> GpuInfo | tuple[GpuInfo, ...]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[GpuInfo]:
        return iter(self._items)

    def to_dict(self) -> dict[str, Any]:
        """`{"gpus": [...], "message": str | None}`, what the Jupyter server extension serves."""
        return {"gpus": [gpu.to_dict() for gpu in self._items], "message": self.message}


def gpus() -> GpuList:
    """Every GPU this process can use, read from NVML now (no CUDA context is created).

    Never raises for a missing GPU, driver or library: the list is then empty and `.message` says why. Each
    GPU's `holders` come from the machine-wide registry (empty where that cannot be read).
    """
    try:
        import pynvml
    except ImportError:
        return GpuList([], NO_NVML)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return GpuList([], _init_failure(pynvml, error))
    try:
        physical = _visible_physical_indices(pynvml)
        if physical is None:
            return GpuList([], NO_DEVICE)
        if not physical:
            hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            return GpuList([], f"No GPU visible: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU of this machine.")
        found = [_read(pynvml, cuda_index, nvml_index) for cuda_index, nvml_index in enumerate(physical)]
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    try:
        held = holders()
    except (GpuError, OSError):  # an unusable registry: reserving says why; listing GPUs still works
        held = {}
    return GpuList([replace(gpu, holders=held.get(gpu_key(gpu.device_id), ())) for gpu in found])


def select_gpu(index: int) -> GpuInfo:
    """Make GPU `index` (as `%gpu` numbers them) the notebook's current CUDA device; returns its GpuInfo.

    Calls `torch.cuda.set_device(index)` where torch can use CUDA; otherwise it only records the choice and
    warns. Raises GpuError naming the index and the GPUs that exist when there is no such GPU.
    """
    if isinstance(index, bool) or not isinstance(index, int):
        raise GpuError(
            f"select_gpu() takes a GPU's index, a whole number as %gpu shows it (like 0), not "
            f"{type(index).__name__} {index!r}."
        )
    available = gpus()
    if not 0 <= index < len(available):
        if available:
            have = ", ".join(f"{gpu.index} ({gpu.name})" for gpu in available)
            raise GpuError(f"GPU {index!r} does not exist: this process sees GPU {have}. Pick one of those indices.")
        reason = (available.message or "").removeprefix("No GPU: ").rstrip(".")
        raise GpuError(f"GPU {index!r} does not exist: this process sees no GPU ({reason}).")
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(index)
    else:
        warn_user(
            f"GPU {index} is recorded as this process's GPU, but this torch cannot use CUDA "
            "(torch.cuda.is_available() is False): install a CUDA build of torch to compute on it."
        )
    _selection.index = index
    return replace(available[index], selected=True)


def training_gpu(current: int) -> int:
    """The GPU (CUDA index) that training in this process uses, reserved for this process until it exits.

    `current` is torch's current device. When another process holds it, training moves to a free GPU (made
    torch's current device) and warns; it stays on a held GPU, with a warning, when no GPU is free or when the
    notebook chose that one with `select_gpu`. Raises GpuError when the GPU registry folder cannot be used.
    Off POSIX (Windows), where there is no registry, training stays on `current` and reserves nothing.
    """
    if not can_reserve():
        return current
    decided: dict[str, Any] = {}

    def choose() -> list[str]:
        found = gpus()
        if not 0 <= current < len(found):  # NVML shows fewer GPUs than CUDA: nothing it could reserve
            return []
        others = found[current].held_by_others()
        free = [gpu for gpu in found if not gpu.held_by_others()]
        moved = bool(others and free and _selection.index != current)
        target = free[0] if moved else found[current]
        decided.update(target=target, others=others, moved=moved, free=bool(free))
        key = gpu_key(target.device_id)
        return [] if key in _training_reservations else [key]

    reservation = reserve(choose, "training")
    for key in reservation.gpus:
        _training_reservations[key] = reservation
    if "target" not in decided:
        return current
    target, others = decided["target"], decided["others"]
    held = f"GPU {current} is held by {'; '.join(holder.describe() for holder in others)}"
    if decided["moved"]:
        warn_user(
            f"{held}: training on GPU {target.index} ({target.name}), which is free. To train on GPU "
            f"{current} anyway, select it first with %gpu {current} (nbscale.select_gpu({current}))."
        )
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(target.index)
        return int(target.index)
    if others:
        why = "you selected it" if _selection.index == current else "no GPU is free"
        warn_user(
            f"{held}: training shares it ({why}), so both run slower and either may run out of GPU "
            "memory. %gpu shows each GPU's holders."
        )
    return current


def release_training_gpus() -> None:
    """Let go of the GPUs training in this process reserved (after a run that ran out of GPU memory, which holds
    nothing there any more: a pool may take them at once). Training again reserves them again."""
    for reservation in set(_training_reservations.values()):
        reservation.release()
    _training_reservations.clear()


def _init_failure(pynvml: Any, error: Exception) -> str:
    if isinstance(error, pynvml.NVMLError_LibraryNotFound | pynvml.NVMLError_DriverNotLoaded):
        return NO_DRIVER
    return f"No GPU: NVML could not start ({error})."


def _visible_physical_indices(pynvml: Any) -> list[int] | None:
    """NVML indices of the GPUs CUDA shows this process, in CUDA's order; None when the machine has none."""
    count = pynvml.nvmlDeviceGetCount()
    if count == 0:
        return None
    restricted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if restricted is None:
        return list(range(count))
    uuids: list[str] | None = None
    physical: list[int] = []
    for entry in (part.strip() for part in restricted.split(",")):
        if entry.isdigit():
            found: int | None = int(entry) if int(entry) < count else None
        elif entry.startswith("GPU-"):
            if uuids is None:
                uuids = [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
            found = next((i for i, uuid in enumerate(uuids) if uuid.startswith(entry)), None)
        else:
            found = None
        if found is None or found in physical:
            break  # CUDA ignores the rest of the list from the first invalid entry on
        physical.append(found)
    return physical


def _read(pynvml: Any, cuda_index: int, nvml_index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)

    def ask(function: str, *args: Any) -> Any:
        try:
            return getattr(pynvml, function)(handle, *args)
        except pynvml.NVMLError:  # NotSupported on some boards (power on GeForce, utilization under MIG)
            return None

    memory = ask("nvmlDeviceGetMemoryInfo")
    capability = ask("nvmlDeviceGetCudaComputeCapability")
    utilization = ask("nvmlDeviceGetUtilizationRates")
    power_mw = ask("nvmlDeviceGetPowerUsage")
    limit_mw = ask("nvmlDeviceGetEnforcedPowerLimit")
    uuid = ask("nvmlDeviceGetUUID")
    return GpuInfo(
        index=cuda_index,
        nvml_index=nvml_index,
        name=_text(ask("nvmlDeviceGetName") or "unknown GPU"),
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        memory_used_mb=memory.used / _MIB if memory else None,
        memory_total_mb=memory.total / _MIB if memory else None,
        utilization_percent=int(utilization.gpu) if utilization else None,
        temperature_c=ask("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
        power_w=power_mw / 1000 if power_mw is not None else None,
        power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
        processes=_processes(pynvml, ask),
        selected=cuda_index == _selection.index,
        uuid=_text(uuid) if uuid else None,
    )


def _processes(pynvml: Any, ask: Any) -> tuple[GpuProcess, ...]:
    seen: dict[int, GpuProcess] = {}
    for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for process in ask(function) or []:
            if process.pid in seen:
                continue
            used = getattr(process, "usedGpuMemory", None)
            try:
                name = _text(pynvml.nvmlSystemGetProcessName(process.pid))
            except pynvml.NVMLError:  # another user's process, or it just ended
                name = None
            seen[process.pid] = GpuProcess(process.pid, name, used / _MIB if isinstance(used, int) else None)
    return tuple(seen.values())


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
