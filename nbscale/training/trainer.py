"""Training (trainNetwork for PyTorch), the core that `nbscale.train` calls (nbscale.notebook adds the displays).

Sets up the event channel (the info first, then the listeners it is given), turns the kernel interrupt into a
Stop at the end of the current iteration, then runs the loop in this process ("auto", "cpu", "gpu") or on the
pool ("parallel", "multi-gpu").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from nbscale.data.loader_data import loader_of, options_over_loader
from nbscale.data.loading import as_dataset
from nbscale.errors import OptionsError, PoolInterrupted
from nbscale.gpu import release_training_gpus
from nbscale.pool.active_stops import registered
from nbscale.pool.interrupts import graceful_interrupt
from nbscale.training.batch_fitting import batch_counts, check_auto_batch_device
from nbscale.training.checkpoint import latest_checkpoint, load_checkpoint
from nbscale.training.checks import (
    check_items,
    check_loss_fn,
    check_model,
    check_resume,
    materialise_lazy_layers,
    with_class_labels,
)
from nbscale.training.events import EventChannel, StopSignal
from nbscale.training.head_checks import check_classes, is_class_loss
from nbscale.training.info import TrainingInfo
from nbscale.training.loop import run_training
from nbscale.training.loop_setup import Where, loop_setup
from nbscale.training.losses import resolve_loss
from nbscale.training.options import TrainingOptions, as_options
from nbscale.training.out_of_memory import released_on_out_of_memory
from nbscale.training.plan import RunPlan, plan_run
from nbscale.training.recovery import train_surviving_lost_workers
from nbscale.training.run_inputs import CheckedInputs
from nbscale.training.run_observers import observed_run
from nbscale.user_warnings import warn_user

INTERRUPT_REASON = "Stopped by kernel interrupt"
STOP_GRACE_S = 3.0  # on the pool: how long the first interrupt waits for the end of the iteration


def train(
    model: nn.Module,
    train_data: Any,
    options: TrainingOptions | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | str | None = None,
    resume_from: str | os.PathLike[str] | None = None,
    *,
    step_fn: Callable[..., Any] | None = None,
    listeners: Sequence[Callable[[Any], None]] = (),
    stop: StopSignal | None = None,
    info: TrainingInfo | None = None,
) -> tuple[nn.Module, TrainingInfo]:
    """Train `model` on `train_data` (a Dataset of (input, label) or a tuple of tensors); returns (net, info).

    `loss_fn(outputs, labels)` must average over the batch, or is a name `options.loss` takes ("mse", ...)
    (default: `options.loss`, cross-entropy when None).
    `step_fn(model, inputs, labels) -> loss | (loss, outputs)` replaces the forward and the loss (mixup,
    distillation), in validation too (nbscale.training.steps); precision, backward, clipping, the step, DDP and
    compile stay nbscale's. `resume_from` is a checkpoint file or a checkpoint_path folder (its newest
    checkpoint); training continues where it stopped with the same schedule and optimizer state. The returned
    net is `model`, trained in place (on a pool the trained weights are copied back).
    Every training event (nbscale.training.events) goes to `info` (made here when None), then to each of
    `listeners` in order; nothing is shown here, and only the kernel interrupt and a pool restart
    (on_worker_failure="restart") print a line (on stderr). `stop` (made when None) is what the listeners and
    the kernel interrupt use to stop at the end of the current iteration; `info.stop_reason` says who did.
    """
    checked = checked_inputs(model, train_data, as_options(options), loss_fn, step_fn)
    return train_planned(model, checked, resume_from, listeners=listeners, stop=stop, info=info)


def train_planned(
    model: nn.Module,
    checked: CheckedInputs,
    resume_from: str | os.PathLike[str] | None = None,
    *,
    listeners: Sequence[Callable[[Any], None]] = (),
    stop: StopSignal | None = None,
    info: TrainingInfo | None = None,
) -> tuple[nn.Module, TrainingInfo]:
    """`train` of inputs `checked_inputs` checked and planned: from here on the run reads its plan alone."""
    dataset, plan = checked.data, checked.plan
    resume = _resume_point(resume_from, model, plan, len(dataset))
    seed = int(resume["seed"]) if resume is not None else draw_seed()

    info = info if info is not None else TrainingInfo()
    stop = stop if stop is not None else StopSignal()
    channel = EventChannel()
    for listener in (info.record, *listeners):  # info first: output_fn reads it
        channel.subscribe(listener)
    on_pool = plan.placement.on_pool
    restarts: list[str] = []
    # observed_run: what other packages watch (inside a %%batch job, `%jobs show` follows this run and its Stop
    # button stops it)
    with _interrupt_as_stop(stop, on_pool) as forced, observed_run(channel, stop), registered(stop, on_pool):
        if on_pool:
            result, restarts = _train_on_pool(model, dataset, plan, seed, resume, channel, stop, forced)
        else:
            result = _train_here(model, dataset, plan, seed, resume, channel, stop, info)
    info.stop_reason = stop.reason or result.stop_reason
    if restarts:
        info.stop_reason += f" (after {len(restarts)} restart{'s' * (len(restarts) > 1)}: {'. '.join(restarts)})"
    return model, info


def _resume_point(
    resume_from: str | os.PathLike[str] | None, model: nn.Module, plan: RunPlan, items: int
) -> dict[str, Any] | None:
    """The checkpoint `resume_from` names, checked against this run (None without one); warns when it is
    trained to max_epochs already."""
    if resume_from is None:
        return None
    resume = load_checkpoint(resume_from)
    size = plan.batching.mini_batch_size
    batch = None if size == "auto" else int(size)  # "auto": the checkpoint's
    check_resume(resume, model, str(plan.recorded["solver"]), batch, items, resume_from)
    max_epochs = plan.batching.max_epochs
    if resume["epoch"] >= max_epochs:
        warn_user(
            f"resume_from={str(resume_from)!r} holds a run trained to epoch {resume['epoch']}, so "
            f"max_epochs={max_epochs} trains no further: raise max_epochs to go on training.",
            RuntimeWarning,
        )
    return resume


def _train_on_pool(
    model: nn.Module,
    dataset: object,
    plan: RunPlan,
    seed: int,
    resume: dict[str, Any] | None,
    channel: EventChannel,
    stop: StopSignal,
    forced: Callable[[], bool],
) -> tuple[Any, list[str]]:
    """(the pool's result, the restarts it took): the run on the pool, restarted without lost workers under
    on_worker_failure="restart"; a PoolInterrupted after a forced stop says what became of the weights."""
    from nbscale.training.distributed import train_on_pool

    def run(resume: dict[str, Any] | None, events: EventChannel) -> Any:
        return train_on_pool(model, dataset, plan, seed, resume, events, stop)

    try:
        if plan.checkpoint.on_worker_failure == "restart":
            max_epochs = plan.batching.max_epochs
            return train_surviving_lost_workers(run, resume, seed, plan.checkpoint, max_epochs, channel, stop)
        return run(resume, channel), []
    except PoolInterrupted as interrupted:
        if forced():
            raise _forced_stop(interrupted, plan.checkpoint.path) from None
        raise


def _train_here(
    model: nn.Module,
    dataset: Any,
    plan: RunPlan,
    seed: int,
    resume: dict[str, Any] | None,
    channel: EventChannel,
    stop: StopSignal,
    info: TrainingInfo,
) -> object:
    """The loop's result, trained in this process; running out of GPU memory says which mini-batch size did."""
    device = training_device(plan.placement.environment)
    size = plan.batching.mini_batch_size
    check_auto_batch_device(plan.batching, device.type == "cuda", "the CPU")

    def message(error: torch.OutOfMemoryError) -> str:
        tried: int | str = info.mini_batch_size or (  # "auto" as chosen, once training started
            "'auto'" if size == "auto" else min(int(size), len(dataset))
        )
        return (
            f"Out of GPU memory training on {describe_device(device)} with mini_batch_size={tried}: lower "
            f"mini_batch_size, or try precision='mixed'. ({error})"
        )

    # raised holding none of the run's frames (which hold the GPU's tensors); the GPU's reservation goes with them
    return released_on_out_of_memory(
        lambda: run_training(
            loop_setup(
                model,
                dataset,
                plan,
                device=device,
                seed=seed,
                hardware=describe_device(device),
                publish=channel.publish,
                stop_reason=lambda: stop.reason,
                counts=batch_counts(plan.batching, len(dataset), 1),
                where=Where(resume=resume, read_each_iteration=plan.listeners.reads_each_iteration),
            )
        ),
        message,
        after=release_training_gpus if device.type == "cuda" else None,
    )


def checked_inputs(
    model: nn.Module,
    train_data: Any,
    options: TrainingOptions,
    loss_fn: Any,
    step_fn: Any = None,
    *,
    one_worker: bool = False,
) -> CheckedInputs:
    """train_data as a Dataset, the options and the run plan, checked before any training (nbscale.training.checks)
    and planned (nbscale.training.plan: every choice of the run resolved, every refusal made here).

    `loss_fn` None takes `options.loss` (a name of nbscale.training.losses, or a callable); a name given as
    `loss_fn` becomes `options.loss`. A callable solver or learn_rate_schedule is tried once on `model` here,
    so a bad factory fails before training starts.

    With the default loss (cross-entropy, when `loss_fn` is None) whole-number float labels become int64; with a
    class loss (that one, CrossEntropyLoss, NLLLoss) the labels must fit the network's outputs (check_classes).
    """
    check_model(model)
    check_loss_fn(loss_fn)
    if isinstance(loss_fn, str):  # a name: the run is the one TrainingOptions(loss=name) gives
        options, loss_fn = options.replace(loss=loss_fn), None
    if step_fn is not None and not callable(step_fn):
        raise OptionsError(
            f"step_fn must be a function (model, inputs, targets) -> loss or (loss, outputs), not "
            f"{type(step_fn).__name__}: leave it out to use the model's output and loss_fn."
        )
    if loss_fn is None and options.loss not in (None, "crossentropy"):
        loss_fn = resolve_loss(options.loss)
    dataset = as_dataset(train_data)
    options = with_loader_batch_size(options, dataset)  # a DataLoader's batch_size, unless the options set one
    for note in options_over_loader(options.shuffle, options.dispatch_in_background, dataset):
        warn_user(note, RuntimeWarning)  # an option set explicitly wins over the loader's setting
    # torch's Dataset declares no __len__; as_dataset checked it
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise OptionsError("train_data is empty: give it at least one sample.")
    first_item = check_items(dataset, "train_data")
    materialise_lazy_layers(model, first_item)
    validation, first_validation_item = _checked_validation(options)
    if loss_fn is None:
        dataset = with_class_labels(dataset, "train_data", first_item)
        if validation is not None:
            validation = with_class_labels(validation, "validation_data", first_validation_item)
    if is_class_loss(loss_fn):  # labels are class indices: the network needs an output for each class
        labelled = [("train_data", dataset, first_item)]
        if validation is not None:
            labelled.append(("validation_data", validation, first_validation_item))
        check_classes(model, first_item, labelled, getattr(loss_fn, "ignore_index", -100))
    if loss_fn is None:
        loss_fn = nn.CrossEntropyLoss()
    first_items = {"train_data": first_item}
    if validation is not None:
        first_items["validation_data"] = first_validation_item
    plan = plan_run(model, dataset, validation, options, loss_fn, step_fn, first_items, one_worker)
    return CheckedInputs(dataset, options, plan)


def _checked_validation(options: TrainingOptions) -> tuple[Any, Any]:
    """options.validation_data as a Dataset and its first item (checked), or (None, None)."""
    if options.validation_data is None:
        return None, None
    validation = as_dataset(options.validation_data, "validation_data")
    if len(validation) == 0:  # type: ignore[arg-type]
        raise OptionsError(
            "validation_data is empty: give it at least one sample, or leave validation_data out "
            "(None) to train without validation."
        )
    return validation, check_items(validation, "validation_data")


def draw_seed() -> int:
    """The seed of a run's data order, drawn from torch's random stream (so torch.manual_seed fixes it)."""
    return int(torch.randint(2**31 - 1, (1,)).item())


@contextlib.contextmanager
def _interrupt_as_stop(stop: StopSignal, on_pool: bool) -> Iterator[Callable[[], bool]]:
    """The first kernel interrupt (SIGINT) asks for a Stop at the end of the iteration and says so; a second one
    raises KeyboardInterrupt at once, for a loop that no longer reaches the end of an iteration.

    On the pool the second step comes by itself: if the training has not stopped STOP_GRACE_S after the first
    interrupt (a frozen worker, a hung collective), the interrupt is forced, and the pool interrupts its workers
    and restarts those that do not stop. Yields a function that tells whether that happened.
    """
    if on_pool:
        notice = (
            f"Stopping at the end of this iteration. If the pool has not stopped in {STOP_GRACE_S:.0f} s, its "
            "workers are interrupted (interrupt again to do that now)."
        )
        # counted only while the pool runs something: not while it is still starting
        force_after: tuple[float, Callable[[], bool]] | None = (STOP_GRACE_S, _pool_busy)
    else:
        notice, force_after = "Stopping at the end of this iteration (interrupt again to stop at once).", None
    with graceful_interrupt(
        lambda: stop.request(INTERRUPT_REASON), lambda: stop.requested, notice, force_after
    ) as forced:
        yield forced


def _pool_busy() -> bool:
    from nbscale.pool.pool import current_pool

    pool = current_pool()
    return pool is not None and pool.busy


def _forced_stop(interrupted: PoolInterrupted, checkpoints: str | None) -> PoolInterrupted:
    """The PoolInterrupted of a pool training that did not stop at the end of its iteration in time
    (`checkpoints`: the run's checkpoint folder, or None)."""
    hint = ""
    if checkpoints:
        last = latest_checkpoint(checkpoints)
        if last is not None:
            hint = f" Continue from the last checkpoint with resume_from={checkpoints!r} ({last})."
    return PoolInterrupted(
        f"Training did not stop at the end of its iteration within {STOP_GRACE_S:.0f} s of the interrupt. "
        f"{interrupted} The network keeps the weights it had before this training (the trained ones were on the "
        f"workers).{hint}"
    )


def training_device(environment: str) -> torch.device:
    """The device for "auto", "cpu" or "gpu" (the notebook's current GPU, or a free one where another process
    holds it: nbscale.gpu.training_gpu)."""
    if environment == "cpu" or (environment == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise OptionsError(
            "execution_environment='gpu' but no CUDA GPU is visible to this process "
            "(torch.cuda.is_available() is False): use execution_environment='auto' or 'cpu' "
            "(nbscale.gpus() or %gpu lists the GPUs)."
        )
    from nbscale.gpu import training_gpu  # reserves the GPU machine-wide (nbscale.gpu_reservations)

    return torch.device("cuda", training_gpu(torch.cuda.current_device()))


def describe_device(device: torch.device) -> str:
    """The device as the training header names it: the GPU's model, or the CPU's thread count."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"CPU ({torch.get_num_threads()} threads)"


def with_loader_batch_size(options: TrainingOptions, train_data: object) -> TrainingOptions:
    """`options` (TrainingOptions) with the mini-batch size of a DataLoader given as `train_data`, where the options
    leave it at its default (128: any other value counts as set by the user); `options` itself otherwise.
    OptionsError when both are set and differ."""
    from dataclasses import fields

    loader = loader_of(train_data)
    if loader is None or options.mini_batch_size == loader.batch_size:
        return options
    default = next(f.default for f in fields(options) if f.name == "mini_batch_size")
    if options.mini_batch_size == default:
        return options.replace(mini_batch_size=loader.batch_size)
    raise OptionsError(
        f"train_data is a DataLoader with batch_size={loader.batch_size}, but TrainingOptions has "
        f"mini_batch_size={options.mini_batch_size!r}: set one of them, or the same value in both "
        f"(mini_batch_size={default}, its default, lets the DataLoader's stand)."
    )
