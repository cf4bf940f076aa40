"""Which devices a pool's workers get: one per GPU, or CPU workers."""

from __future__ import annotations

import os

from nbscale.errors import PoolError

MAX_DEFAULT_CPU_WORKERS = 4


def visible_gpu_ids() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries for workers (from NVML; no CUDA context).

    Each GPU's UUID where NVML gives one: CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
    while NVML numbers them by PCI bus, so an index could give a worker another GPU than the one listed.
    """
    from nbscale.gpu import gpus

    return [gpu.uuid or str(gpu.nvml_index) for gpu in gpus()]


def plan_devices(n: int | None, gpus: list[int] | None, cpu: bool) -> list[str | None]:
    """One entry per worker: the CUDA_VISIBLE_DEVICES value of its GPU, or None for a CPU worker."""
    if n is not None and (not isinstance(n, int) or n < 1):
        raise PoolError(f"A pool needs at least one worker, not {n!r}: use %pool start N with N >= 1.")
    if cpu and gpus:
        raise PoolError("--cpu and --gpus contradict each other: give one of them.")
    visible = [] if cpu else visible_gpu_ids()
    if gpus:
        missing = [index for index in gpus if not 0 <= index < len(visible)]
        if missing:
            have = f"GPUs 0-{len(visible) - 1}" if visible else "no GPU"
            raise PoolError(
                f"GPU {', '.join(map(str, missing))} does not exist: this machine shows {have}. "
                "Pick indices from %gpu, or start CPU workers with --cpu."
            )
        if n is not None and n != len(gpus):
            raise PoolError(f"--gpus lists {len(gpus)} GPUs but N is {n}: one worker runs per listed GPU.")
        return [visible[index] for index in gpus]
    if visible:
        if n is not None and n > len(visible):
            raise PoolError(
                f"{n} GPU workers asked for but this machine shows {len(visible)} GPUs: one worker runs per GPU. "
                "Use N <= the GPU count, or add --cpu for CPU workers."
            )
        return list(visible[: n or len(visible)])
    return [None] * (n or min(os.cpu_count() or 1, MAX_DEFAULT_CPU_WORKERS))
