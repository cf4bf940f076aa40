"""Which devices a local pool's workers get: one per GPU, or CPU workers."""

from __future__ import annotations

import os

from nbscale.errors import PoolError

MAX_DEFAULT_CPU_WORKERS = 4
CPU_WORKERS_PER_CORE = 4  # each CPU worker is a process with its own torch: more per core only slows each down


def visible_gpu_ids() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries for workers (from NVML; no CUDA context).

    Each GPU's UUID where NVML gives one: CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
    while NVML numbers them by PCI bus, so an index could give a worker another GPU than the one listed.
    """
    from nbscale.gpu import gpus

    return [gpu.uuid or str(gpu.nvml_index) for gpu in gpus()]


def plan_devices(n: int | None, gpus: tuple[int, ...] | None, cpu: bool) -> list[str | None]:
    """One entry per worker: the CUDA_VISIBLE_DEVICES value of its GPU, or None for a CPU worker.

    `n`, `gpus` and `cpu` are checked PoolSettings fields; this checks them against the machine.
    """
    visible = [] if cpu else visible_gpu_ids()
    if gpus:
        missing = [index for index in gpus if not 0 <= index < len(visible)]
        if missing:
            have = f"GPUs 0-{len(visible) - 1}" if visible else "no GPU"
            raise PoolError(
                f"GPU {', '.join(map(str, missing))} does not exist: this machine shows {have}. "
                "Pick indices from %gpu, or start CPU workers with --cpu."
            )
        return [visible[index] for index in gpus]
    if visible:
        if n is not None and n > len(visible):
            raise PoolError(
                f"{n} GPU workers asked for but this machine shows {len(visible)} GPUs: one worker runs per GPU. "
                "Use N <= the GPU count, or add --cpu for CPU workers."
            )
        return list(visible[: n or len(visible)])
    cores = os.cpu_count() or 1
    if n is not None and n > CPU_WORKERS_PER_CORE * cores:
        raise PoolError(
            f"{n} CPU workers on {cores} CPU cores: at most {CPU_WORKERS_PER_CORE * cores} ({CPU_WORKERS_PER_CORE} per "
            "core) start here, each slower the more there are. Ask for fewer, or use --cluster for more machines."
        )
    return [None] * (n or min(cores, MAX_DEFAULT_CPU_WORKERS))
