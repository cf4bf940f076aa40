"""Which devices a local pool's workers get: one per free GPU, or CPU workers; and the GPUs' reservation.

GPUs another process holds (another notebook's pool or training, any user's: nbscale.gpu_reservations) are
left alone by default: `%pool start` takes the free ones, and `--gpus` naming a held one is an error naming
its holder. `force` (`--force`) takes held GPUs too, sharing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nbscale.cpus import available_cpus
from nbscale.errors import PoolError
from nbscale.gpu import GpuInfo
from nbscale.gpu import gpus as read_gpus
from nbscale.gpu_reservations import GpuReservation, gpu_key, reserve

MAX_DEFAULT_CPU_WORKERS = 4
CPU_WORKERS_PER_CORE = 4  # each CPU worker is a process with its own torch: more per core only slows each down


def visible_gpu_ids() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries for workers (from NVML; no CUDA context).

    Each GPU's UUID where NVML gives one: CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
    while NVML numbers them by PCI bus, so an index could give a worker another GPU than the one listed.
    """
    return [gpu.device_id for gpu in read_gpus()]


@dataclass(frozen=True)
class DevicePlan:
    """One entry per worker (its CUDA_VISIBLE_DEVICES value, or None for a CPU worker) and the reservation of
    its GPUs, which the pool holds until it stops (None for CPU workers)."""

    devices: list[str | None]
    reservation: GpuReservation | None = None


def reserve_devices(n: int | None, gpus: tuple[int, ...] | None, cpu: bool, force: bool = False) -> DevicePlan:
    """`plan_devices`, with the chosen GPUs reserved machine-wide for this process in the same step.

    Raises PoolError as plan_devices does, and GpuError when the GPU registry folder cannot be used.
    """
    if cpu or not read_gpus():
        return DevicePlan(plan_devices(n, gpus, cpu, force, visible=()))
    chosen: list[str | None] = []

    def choose() -> list[str]:  # under the registry's lock: the holders it reads stay true
        chosen[:] = plan_devices(n, gpus, cpu, force)
        return [gpu_key(device) for device in chosen if device is not None]

    reservation = reserve(choose, "pool")
    return DevicePlan(chosen, reservation)


def plan_devices(
    n: int | None,
    gpus: tuple[int, ...] | None,
    cpu: bool,
    force: bool = False,
    visible: Sequence[GpuInfo] | None = None,
) -> list[str | None]:
    """One entry per worker: the CUDA_VISIBLE_DEVICES value of its GPU, or None for a CPU worker.

    `n`, `gpus`, `cpu` and `force` are checked PoolSettings fields; this checks them against the machine's GPUs
    (`visible`, read from NVML when None) and their holders. Reserves nothing (see reserve_devices).
    """
    found = list(visible if visible is not None else ([] if cpu else read_gpus()))
    if gpus:
        return _named_gpus(found, gpus, force)
    if found:
        if n is not None and n > len(found):
            raise PoolError(
                f"{n} GPU workers asked for but this machine shows {len(found)} GPUs: one worker runs per GPU. "
                "Use N <= the GPU count, or add --cpu for CPU workers."
            )
        free = [gpu for gpu in found if not gpu.held_by_others()]
        held = [gpu for gpu in found if gpu.held_by_others()]
        usable = free + held if force else free  # forced: free GPUs first, then shared ones
        if not usable:
            raise PoolError(
                f"Every GPU of this machine is held by another process: {_held(held)}. Wait until one "
                "is released (%gpu shows the holders), share them with --force (force=True), or start CPU "
                "workers with --cpu."
            )
        if n is not None and n > len(usable):
            raise PoolError(
                f"{n} GPU workers asked for but only {len(usable)} of the {len(found)} GPUs are free: "
                f"{_held(held)}. Use N <= {len(usable)}, wait until they are released, or add "
                "--force (force=True) to share held GPUs."
            )
        return [gpu.device_id for gpu in usable[: n or len(usable)]]
    return _cpu_workers(n)


def _cpu_workers(n: int | None) -> list[str | None]:
    """`plan_devices` on a machine without GPUs (or with --cpu): `n` CPU workers, or one per core up to a limit."""
    cores = available_cpus()
    if n is not None and n > CPU_WORKERS_PER_CORE * cores:
        raise PoolError(
            f"{n} CPU workers on {cores} CPU cores: at most {CPU_WORKERS_PER_CORE * cores} ({CPU_WORKERS_PER_CORE} per "
            "core) start here, each slower the more there are. Ask for fewer, or use --cluster for more machines."
        )
    return [None] * (n or min(cores, MAX_DEFAULT_CPU_WORKERS))


def _named_gpus(found: list[GpuInfo], gpus: tuple[int, ...], force: bool) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES values of the GPUs --gpus names, checked: each exists, and is free (or `force`)."""
    missing = [index for index in gpus if not 0 <= index < len(found)]
    if missing:
        have = f"GPUs 0-{len(found) - 1}" if found else "no GPU"
        raise PoolError(
            f"{'GPU' if len(missing) == 1 else 'GPUs'} {', '.join(map(str, missing))} "
            f"{'does' if len(missing) == 1 else 'do'} not exist: this machine shows {have}. "
            "Pick indices from %gpu, or start CPU workers with --cpu."
        )
    asked = [found[index] for index in gpus]
    held = [gpu for gpu in asked if gpu.held_by_others()]
    if held and not force:
        free_now = [str(gpu.index) for gpu in found if not gpu.held_by_others()]
        pick = f"Pick free GPUs (free now: {', '.join(free_now)})" if free_now else "Wait until one is released"
        raise PoolError(
            f"{_held(held)}. {pick}, or add --force (force=True) to share {'it' if len(held) == 1 else 'them'} "
            "anyway; %gpu shows each GPU's holders."
        )
    return [gpu.device_id for gpu in asked]


def _held(gpus: Sequence[GpuInfo]) -> str:
    """ "GPU 1 is held by bob's pool (notebook b.ipynb, pid 77); GPU 2 is held by ..."."""
    return "; ".join(
        f"GPU {gpu.index} is held by {' and '.join(holder.describe() for holder in gpu.held_by_others())}"
        for gpu in gpus
    )
