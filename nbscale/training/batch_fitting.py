"""`mini_batch_size="auto"` and `learn_rate_scaling="linear"`: the mini-batch fitted to the GPUs, the rate to it.

MATLAB's guidance for several GPUs: scale the mini-batch with the number of GPUs, and the learn rate with the
mini-batch. Here both are automatic:
- "auto" (GPUs only): each worker with work probes its own GPU with one training step (forward, loss, backward
  and the solver's step, of the user's network on the run's own first samples, under the run's precision, after
  the training data is in place), at powers of two from FIRST_PROBE up or down, and keeps the largest that runs
  with HEADROOM of the memory available to it left over (for what the probe does not exercise: DDP's gradient
  buckets, validation, the allocator's fragmentation). The workers take the smallest of their answers, and the
  global mini-batch is that per-worker one times the workers with work (with an uneven worker_load, the most
  loaded worker takes the per-worker one). At most MAX_PER_WORKER a worker and at most the data.
- "linear": training uses initial_learn_rate x global mini-batch / learn_rate_reference_batch (128 by default,
  MATLAB's default mini-batch): initial_learn_rate is the rate for a mini-batch of that size.
The probe leaves the network, its BatchNorm statistics and the random number generators as they were.
A resumed run with "auto" takes the mini-batch its checkpoint was trained with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nbscale.data.loading import split_batch
from nbscale.errors import OptionsError
from nbscale.training.plan_rules import Batching
from nbscale.training.solver import SolverRule

if TYPE_CHECKING:
    from nbscale.training.plan import RunPlan

HEADROOM = 0.2  # the fraction of a GPU's available memory left free by the probe's step
FIRST_PROBE = 32  # the per-worker mini-batch probed first: the search doubles or halves from there
MAX_PER_WORKER = 1024  # larger mini-batches seldom train faster per image, and give fewer updates an epoch


def largest_fitting_batch(fits: Callable[[int], bool], limit: int, start: int = FIRST_PROBE) -> int:
    """The largest power of two `b <= limit` for which `fits(b)`, or 0 when not even 1 fits.

    Memory grows with the batch, so the search doubles from `start` while it fits (or halves while it does not)
    and stops at the first change: about |log2(answer / start)| + 1 calls.
    """
    if limit < 1:
        return 0
    batch = 1 << (min(start, limit).bit_length() - 1)  # the largest power of two <= min(start, limit)
    if fits(batch):
        while batch * 2 <= limit and fits(batch * 2):
            batch *= 2
        return batch
    while batch > 1:
        batch //= 2
        if fits(batch):
            return batch
    return 0


def check_auto_batch_device(batching: Batching, on_gpus: bool, where: str) -> None:
    """OptionsError, before training, for mini_batch_size="auto" where training runs on the CPU."""
    if batching.mini_batch_size == "auto" and not on_gpus:
        raise OptionsError(
            f"mini_batch_size='auto' fits the mini-batch to GPU memory, but this run trains on {where}: give a "
            "number, e.g. mini_batch_size=128, or train on GPUs (execution_environment='gpu', 'multi-gpu', or "
            "'parallel' with a GPU pool)."
        )


def batch_counts(batching: Batching, samples: int, world_size: int) -> list[int]:
    """Samples per rank in each global mini-batch (nbscale.data.loading.split_batch); for "auto", where the
    loop fits them, 1 for each rank with work and 0 for a rank that sits out (worker_load 0)."""
    if batching.mini_batch_size == "auto":
        weights = batching.worker_load if batching.worker_load is not None else [1.0] * world_size
        split_batch(world_size, weights, world_size)  # the same error as a number for a worker_load of wrong length
        return [1 if float(weight) > 0 else 0 for weight in weights]
    return split_batch(min(int(batching.mini_batch_size), samples), batching.worker_load, world_size)


@dataclasses.dataclass(frozen=True)
class Choices:
    """What the run trains with: the plan with the mini-batch and learn rate settled, and why (one line each)."""

    plan: RunPlan  # mini_batch_size a number, the solver's learn rate the rate used, learn_rate_scaling "none"
    counts: list[int]
    said: str  # "" when nothing was chosen


def settle(
    plan: RunPlan,
    counts: list[int],
    samples: int,
    resume: dict[str, Any] | None,
    probe: Callable[[int], Callable[[int], bool]],
    smallest: Callable[[int], int],
) -> Choices:
    """Settle "auto" and "linear" for one rank (every rank of a pool reaches the same choices).

    `probe(limit)` gives the rank's `fits` predicate (only called for "auto" without a checkpoint); `smallest(b)` is
    the smallest `b` over the ranks with work (an all-reduce on a pool).
    """
    said: list[str] = []
    rules = plan.batching
    batch: int | str = rules.mini_batch_size
    weights = [float(w) for w in rules.worker_load] if rules.worker_load is not None else [1.0] * len(counts)
    loaded = [w for w, count in zip(weights, counts, strict=True) if count > 0]
    workers = len(loaded)
    if batch == "auto":
        saved = (resume or {}).get("options", {}).get("mini_batch_size")
        if resume is not None and isinstance(saved, int):
            batch = min(saved, samples)
            said.append(f"mini_batch_size='auto': {batch}, as the checkpoint resumed from was trained with")
        else:
            spread = sum(loaded) / max(loaded)  # the global mini-batch per sample of the most loaded worker
            limit = min(MAX_PER_WORKER, max(1, int(samples / spread)))
            per_worker = smallest(largest_fitting_batch(probe(limit), limit))
            if per_worker == 0:
                raise OptionsError(
                    "mini_batch_size='auto': one training step of a single sample does not fit in the GPU memory "
                    f"(with {HEADROOM:.0%} of it left free): use a smaller network or inputs, precision='mixed', or "
                    "free the GPU (%gpu shows what holds it)."
                )
            batch = min(samples, int(per_worker * spread))
            if workers == 1:
                across, whose = "", "the GPU's"
            elif len(set(loaded)) == 1:
                across, whose = f" a worker x {workers} workers = {batch}", "every worker's GPU"
            else:
                across, whose = f" for the most loaded worker, {batch} in all (worker_load)", "every worker's GPU"
            capped = f" (the most allowed: {MAX_PER_WORKER} a worker, and the data)" if per_worker * 2 > limit else ""
            said.append(
                f"mini_batch_size='auto': {per_worker}{across}, the largest power of two whose training "
                f"step (probed at precision '{plan.placement.precision}') left {HEADROOM:.0%} of {whose} memory "
                f"free{capped}"
            )
        counts = split_batch(batch, rules.worker_load, len(counts))
    global_batch = sum(counts)
    rate = plan.solver.learn_rate
    if rules.learn_rate_scaling == "linear":
        base, reference = rate, rules.learn_rate_reference_batch
        rate = base * global_batch / reference
        said.append(
            f"learn_rate_scaling='linear': initial_learn_rate {base:g} x {global_batch} / {reference} "
            f"(learn_rate_reference_batch) = {rate:.4g}"
        )
    return Choices(plan.settled(batch, rate), counts, "; ".join(said))


def gpu_probe(
    model: nn.Module,
    data: Any,
    solver: SolverRule,
    forward: Callable[[nn.Module, Any, Any], tuple[torch.Tensor, Any]],
    device: torch.device,
    autocast: Any,
    seed: int,
) -> Callable[[int], Callable[[int], bool]]:
    """`probe(limit)` for `settle` on a CUDA `device`: `fits(b)` runs one training step at `b` samples (the
    data's first `b`) and says whether it ran with HEADROOM of the memory available to this process left free.
    `forward(model, inputs, labels) -> (loss, outputs)` is the step's forward and loss as the loop runs it (the
    user's step_fn where given).

    The step's memory is measured by the caching allocator's peak; memory other processes hold is not counted as
    available. Call `probe` inside `untouched(model, device)`: the steps change the weights.
    """

    def probe(limit: int) -> Callable[[int], bool]:
        model.train()  # as the loop trains it (dropout, BatchNorm on the batch)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
        budget = (1 - HEADROOM) * (free + torch.cuda.memory_reserved(device))
        optimizer = solver.make(model)

        def step(batch: int) -> None:
            batches = data.epoch(torch.arange(batch)[None], seed)
            try:
                inputs, labels = next(iter(batches))
                with autocast:
                    loss, _ = forward(model, inputs, labels)
                loss.backward()
                optimizer.step()
            finally:
                getattr(batches, "close", lambda: None)()  # a generator: let go of its batch now

        def fits(batch: int) -> bool:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            try:
                step(batch)
                torch.cuda.synchronize(device)
                ran = True
            except RuntimeError as error:  # torch.OutOfMemoryError is one
                if not out_of_memory(error):
                    raise  # an error of the network or the data: as training would raise it
                traceback.clear_frames(error.__traceback__)  # the failed step's frames hold its tensors
                ran = False
            finally:
                optimizer.zero_grad(set_to_none=True)
            peak = torch.cuda.max_memory_reserved(device)
            optimizer.state.clear()  # the solver's state is made again at the next step's size
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)  # training's peak is training's own, not the probe's
            return ran and peak <= budget

        return fits

    return probe


def out_of_memory(error: Exception) -> bool:
    """True for the caching allocator's OutOfMemoryError and for cuDNN's and cuBLAS's own failed allocations."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text or "ALLOC_FAILED" in text


@contextlib.contextmanager
def untouched(model: nn.Module, device: torch.device) -> Iterator[None]:
    """A block in which the probe may train `model`: its weights and buffers (kept in host memory meanwhile, so
    the probe has the GPU's), its gradients and the random number generators are put back afterwards."""
    saved = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            yield
    finally:
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tensor.copy_(saved[name])
        for parameter in model.parameters():
            parameter.grad = None


def smallest_over(group: torch.distributed.ProcessGroup | None, device: torch.device) -> Callable[[int], int]:
    """`smallest(b)` for `settle`: the minimum of `b` over the ranks of `group` (None: this process alone)."""
    if group is None:
        return lambda batch: batch

    def smallest(batch: int) -> int:
        value = torch.tensor([batch], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN, group=group)
        return int(value.item())

    return smallest


def no_probe(limit: int) -> Callable[[int], bool]:
    """The probe where none may run (a CPU): check_auto_batch_device refuses "auto" there before training."""
    raise OptionsError("mini_batch_size='auto' needs a GPU to probe.")
