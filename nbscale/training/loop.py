"""The training loop, the same in the notebook's process and on every pool worker.

Reads top to bottom, like airbench: setup chooses every variant once (the data source, precision and loss
scaling, channels_last, DistributedDataParallel on a pool, torch.compile, gradient clipping, how the figures are
kept), then per epoch and per iteration the step itself (forward, loss, backward, clip, step), the bunched reads
of the figures with the stop checks, validation, events, and a checkpoint per epoch.
On a pool each rank trains on its share of every global mini-batch, and DDP's communication hook sums the
gradients weighted by the ranks' shares (nbscale.training.figures), so the update equals the single-process one.
A pool where one rank has all the work runs the loop as in one process: no DDP, no per-iteration collective.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbscale.data.loader_data import LoaderBatches, MatlabBatches, make_epoch_batches
from nbscale.data.loading import BatchSource
from nbscale.errors import OptionsError
from nbscale.training.batch_fitting import gpu_probe, no_probe, out_of_memory, settle, smallest_over, untouched
from nbscale.training.best_validation import Best, best_updated, objective_nan, patience_met
from nbscale.training.checkpoint import prepare_folder, save_checkpoint
from nbscale.training.checks import misfit_error
from nbscale.training.compiling import compiled_network
from nbscale.training.events import IterationDone, TrainingDone, TrainingStarted
from nbscale.training.figures import READ_EVERY, CarryingHook, Figures, KeptMetrics, LocalFigures, Pending, PoolFigures
from nbscale.training.gradients import clip_gradients as clip_gradients
from nbscale.training.gradients import clipping
from nbscale.training.held_data import first_input, held_data
from nbscale.training.layout import layout_restored, train_channels_last
from nbscale.training.loop_checkpoint import restored
from nbscale.training.loop_setup import LoopResult as LoopResult
from nbscale.training.loop_setup import LoopSetup
from nbscale.training.loop_setup import loop_setup as loop_setup
from nbscale.training.plan import RunPlan
from nbscale.training.process_settings import autotune_convolutions, cheap_garbage_collection, cudnn_setting_restored
from nbscale.training.read_rule import ReadRule
from nbscale.training.reading_progress import epoch_seed
from nbscale.training.run_metrics import Objective
from nbscale.training.solver import Schedule, base_rate
from nbscale.training.steps import short_repr
from nbscale.training.validator import Validator, validation_batch


def run_training(setup: LoopSetup) -> LoopResult:
    """Train `setup.model` in place; returns the output network's state and why training ended."""
    with (
        cheap_garbage_collection(),
        layout_restored(setup.model),
        cudnn_setting_restored(),
        contextlib.ExitStack() as closing,
    ):
        return _train(setup, closing)


def _train(setup: LoopSetup, closing: contextlib.ExitStack) -> LoopResult:
    """The loop; `closing` stops the data's background processes when it ends, however it ends."""
    run = _set_up(setup, closing)
    _start(run)
    while run.epoch < run.max_epochs and run.stop_reason is None:
        _train_epoch(run)
        _end_epoch(run)
    return _finish(run)


@dataclass(eq=False, kw_only=True)
class _Run:
    """What the loop's parts share: the variants chosen in setup, then the run's counters."""

    setup: LoopSetup
    model: nn.Module
    net: nn.Module  # the model, in DDP and/or compiled
    data: BatchSource
    validation: Validator | None
    forward: Callable[[nn.Module, Any, Any], tuple[torch.Tensor, Any]]  # forward + loss, or step_fn
    autocast: Any
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    clip: Callable[[], None]
    figures: Figures  # how the figures are kept and read (one process, or with DDP's hook)
    reading: ReadRule  # when they are read
    metrics: KeptMetrics
    objective: Objective
    iterations_per_epoch: int
    global_batch: int
    started: dict[str, Any]  # what TrainingStarted says of the setup (chosen, prepare_seconds, data_placement)
    batches: MatlabBatches | LoaderBatches  # each epoch's samples: the DataLoader's own, or MATLAB's
    epoch: int = 0
    iteration: int = 0
    images: int = 0
    history: list[IterationDone] = field(default_factory=list)
    best: Best = field(default_factory=Best)  # the best validation so far
    pending: list[Pending] = field(default_factory=list)
    first_iteration: int = 1  # a failure of its step is the network not fitting the data (misfit_error)
    start: float = 0.0
    stop_reason: str | None = None

    @property
    def plan(self) -> RunPlan:
        return self.setup.plan

    @property
    def max_epochs(self) -> int:
        return self.setup.plan.batching.max_epochs


# ---- setup: every variant chosen once --------------------------------------------------------------------------


def _set_up(setup: LoopSetup, closing: contextlib.ExitStack) -> _Run:
    """The data held where training runs, precision, layout, the settled batch, the solver and schedule, DDP,
    compile, the metrics and how the figures are read."""
    model = setup.model.to(setup.device)
    data, validation, autocast_dtype, scaler, started = held_data(setup, model, closing)
    device = setup.device
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    train_channels_last(model, device, first_input(data, setup.seed), autocast)  # undone by layout_restored
    autotune_convolutions(device)  # after the layout check's one-sample pass: no tuning for its shapes
    # mini_batch_size="auto" (a probe of the GPU, with the data in place) and learn_rate_scaling, settled
    setup, started["choices"] = _settled(setup, model, data, autocast)
    plan = setup.plan
    if validation is not None:
        validation.split(validation_batch(setup.validation_data, max(setup.counts)))
    global_batch, local = sum(setup.counts), setup.counts[setup.rank]
    # a DataLoader's batches as iterating it gives them; MATLAB's (the last partial mini-batch dropped) otherwise
    batches = make_epoch_batches(
        setup.train_data, len(data), plan.batching.shuffle, setup.seed, setup.counts, setup.rank
    )
    iterations_per_epoch = batches.iterations
    optimizer = plan.solver.make(model)
    forward = plan.step.train  # (net, inputs, labels) -> (loss, outputs or None)
    # the plan's metrics (a copy: this rank learns their class count from its first batch)
    metrics = KeptMetrics(copy.deepcopy(plan.metrics), plan.metrics_named)
    net, figures = _network_and_figures(setup, model, metrics, local / global_batch)
    if plan.placement.compile:  # tried on the first batch: a network that cannot compile trains eagerly, with a warning
        trial = _trial(data, batches.first_rows(), setup.seed, autocast, forward)
        compiling = time.perf_counter()
        net = compiled_network(net, plan.placement.compile, trial, model, device, warn=setup.warn)
        started["compile_seconds"] = time.perf_counter() - compiling
    reading = ReadRule(
        figures, plan.validation.frequency, iterations_per_epoch * plan.batching.max_epochs, validation is not None
    )
    return _Run(
        setup=setup,
        model=model,
        net=net,
        data=data,
        validation=validation,
        forward=forward,
        autocast=autocast,
        scaler=scaler,
        optimizer=optimizer,
        schedule=plan.schedule.make(optimizer, iterations_per_epoch, plan.solver.learn_rate, plan.solver.custom),
        clip=clipping(model, optimizer, scaler, plan.solver),
        figures=figures,
        reading=reading,
        metrics=metrics,
        objective=plan.objective,
        iterations_per_epoch=iterations_per_epoch,
        global_batch=global_batch,
        started=started,
        batches=batches,
    )


def _network_and_figures(
    setup: LoopSetup, model: nn.Module, metrics: KeptMetrics, share: float
) -> tuple[nn.Module, Figures]:
    """The network the step calls and how the figures are kept and read: on several ranks with work, DDP with the
    figures summed with the last gradient bucket; else the model and the figures read in this process."""
    if setup.group is not None:
        return _distributed(model, setup, share, metrics)
    graphs = setup.plan.placement.replays_graphs
    return model, LocalFigures(setup.stop_reason, _read_every(setup), graphs, metrics)


# ---- the run: start, epochs, steps, reports, end ---------------------------------------------------------------


def _start(run: _Run) -> None:
    """Restore a checkpoint's state, then tell the listeners what this run is (a resumed run: its history)."""
    setup = run.setup
    if setup.resume is not None:
        run.batches.skip(int(setup.resume["epoch"]))  # before the global stream is restored: it draws from it
        run.epoch, run.iteration, run.history, run.best = restored(
            setup.resume, run.model, run.optimizer, run.scaler, run.schedule
        )
    if setup.is_main and run.plan.checkpoint.path:
        prepare_folder(run.plan.checkpoint.path)
    setup.publish(
        TrainingStarted(
            run.max_epochs,
            run.iterations_per_epoch,
            run.global_batch,
            setup.hardware,
            time.time(),
            first_iteration=run.iteration + 1,
            initial_learn_rate=base_rate(run.optimizer),
            metric_names=run.metrics.names,
            objective_metric=run.objective.name,
            objective_goal=run.objective.goal,
            **run.started,
        )
    )
    setup.publish(list(run.history))  # a resumed run shows its whole history
    run.first_iteration = run.iteration + 1
    # a resumed run goes on counting time and images from where its checkpoint ended
    run.start = time.perf_counter() - (run.history[-1].time_since_start if run.history else 0.0)
    run.images = run.history[-1].images if run.history else 0
    run.reading.last_read = time.perf_counter()


def _train_epoch(run: _Run) -> None:
    """One epoch's steps, with the figures read in bunches (or when an iteration needs them) and reported."""
    run.epoch += 1
    setup = run.setup
    rows = run.batches.rows(run.epoch)
    run.model.train()
    for step, (inputs, labels) in enumerate(run.data.epoch(rows, epoch_seed(setup.seed, run.epoch)), 1):
        _step(run, inputs, labels, run.batches.sizes[step - 1])
        epoch_end = step == len(rows)
        due = run.reading.validation_due(run.iteration)
        asked = run.figures.stop_asked()
        needed = run.reading.needed(run.iteration, asked, due, epoch_end and run.plan.checkpoint.due(run.epoch))
        if not run.reading.now(len(run.pending), needed, epoch_end):
            continue
        readings, run.pending = run.figures.read(run.pending, asked, wait=needed), []
        _report(run, readings, due)
        if run.stop_reason is not None:
            break


def _step(run: _Run, inputs: Any, labels: Any, size: int) -> None:
    """One iteration: forward and loss (or the user's step_fn), backward, clip, step; its figures kept unread."""
    run.iteration += 1
    learn_rate = run.schedule.before_iteration(run.iteration)
    try:
        with run.autocast:
            loss, outputs = run.forward(run.net, inputs, labels)
    except Exception as error:
        if run.iteration == run.first_iteration and not out_of_memory(error) and not isinstance(error, OptionsError):
            raise misfit_error(error, inputs, labels) from error
        raise
    if run.iteration == run.first_iteration:
        _check_loss(loss, run.setup.plan.step_fn)
    elif run.setup.plan.step_fn is not None and not isinstance(loss, torch.Tensor):  # later iterations: the type alone
        _check_loss(loss, run.setup.plan.step_fn, run.iteration)
    kept = run.figures.keep(loss, outputs, labels)
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    run.clip()
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.schedule.after_iteration()
    run.images += size  # the global batch's samples (a DataLoader's last batch may be smaller)
    run.pending.append(Pending(run.epoch, run.iteration, time.perf_counter() - run.start, learn_rate, run.images, kept))


def _report(run: _Run, readings: list[Any], due: bool) -> None:
    """Stop checks (acted on at the end of the last iteration read; a non-finite loss ends the history at its
    iteration), then validation, then each iteration's event."""
    for reading in readings:
        finite = math.isfinite(reading.training_loss)
        if not finite:
            run.epoch, run.iteration, run.images = reading.epoch, reading.iteration, reading.images
            run.stop_reason = (
                f"Training loss is {reading.training_loss} at iteration {run.iteration} "
                f"(epoch {run.epoch}): lower initial_learn_rate or set gradient_threshold."
            )
            if run.setup.warn is not None:
                run.setup.warn(run.stop_reason)
        elif reading.stops and run.stop_reason is None:
            run.stop_reason = run.setup.stop_reason() or "Stopped on request"
        validation_loss, validation_metrics = None, None
        if reading is readings[-1] and run.validation is not None and (due or run.stop_reason is not None) and finite:
            validation_loss, validation_metrics = _validate(run, reading.iteration)
            reading.time = time.perf_counter() - run.start  # the iteration's time includes its validation
        event = IterationDone(
            reading.epoch,
            reading.iteration,
            reading.time,
            reading.training_loss,
            reading.accuracy,
            reading.learn_rate,
            reading.images,
            validation_loss,
            (validation_metrics or {}).get("accuracy"),
            reading.metrics,
            validation_metrics,
        )
        run.history.append(event)
        run.setup.publish(event)
        # a listener (output_fn, the Stop button) may have asked just now; with a later bunch trained and unread,
        # the next iteration's stop check reads that bunch too and stops
        if run.stop_reason is None and run.figures.unread is None and run.figures.stop_asked():
            run.stop_reason = run.setup.stop_reason()
        if not finite:
            break


def _validate(run: _Run, iteration: int) -> tuple[float, dict[str, float | None]]:
    """Validate `iteration`'s network: the schedule (ReduceLROnPlateau) and the objective's patience see it."""
    assert run.validation is not None  # the caller validates only with validation data
    validation_loss, validation_metrics = run.validation.evaluate(run.metrics)
    # ReduceLROnPlateau's step, with the objective's value or the validation loss
    run.schedule.after_validation(run.plan.schedule.plateau_value(validation_loss, validation_metrics))
    improved = best_updated(
        run.best, run.objective.score(validation_loss, validation_metrics), iteration, run.model, run.plan.validation
    )
    if run.stop_reason is None:
        run.stop_reason = objective_nan(run.objective, validation_metrics, iteration)
    if not improved and run.best.bad >= run.plan.validation.patience and run.stop_reason is None:
        run.stop_reason = patience_met(run.plan.validation, run.objective)
    run.model.train()
    return validation_loss, validation_metrics


def _end_epoch(run: _Run) -> None:
    """The schedule's epoch step, and a checkpoint (complete epochs only, so resume continues with no lost or
    repeated epoch)."""
    if run.stop_reason is not None:
        return
    run.schedule.after_epoch()
    setup, checkpoint = run.setup, run.plan.checkpoint
    if setup.is_main and checkpoint.path and checkpoint.due(run.epoch):
        save_checkpoint(
            checkpoint.path,
            run.epoch,
            {
                "model": run.model.state_dict(),
                "optimizer": run.optimizer.state_dict(),
                "scaler": run.scaler.state_dict(),
                "schedule": run.schedule.state_dict(),
                "epoch": run.epoch,
                "iteration": run.iteration,
                "seed": setup.seed,
                "history": run.history,
                "best": run.best.saved(),
                "rng": torch.get_rng_state(),
                "options": run.plan.recorded,
                "samples": len(setup.train_data),
            },
        )


def _finish(run: _Run) -> LoopResult:
    """The output network and the TrainingDone event.

    A stop asked while an iteration's event went out (output_fn, the Stop button) ends the run after that
    iteration, which was not validated: it is validated now, so the final figures are the returned network's.
    """
    final_loss, final_metrics = None, None
    history, model, rule = run.history, run.model, run.plan.validation
    if (
        run.validation is not None
        and history
        and history[-1].validation_loss is None
        and math.isfinite(history[-1].training_loss)
    ):
        final_loss, final_metrics = run.validation.evaluate(run.metrics)
        best_updated(run.best, run.objective.score(final_loss, final_metrics), run.iteration, model, rule)
    stop_reason = run.stop_reason or "Max epochs completed"
    output_iteration = run.iteration
    if rule.output_network == "best-validation" and run.best.state is not None:
        model.load_state_dict(run.best.state)
        output_iteration = run.best.iteration
    elapsed = time.perf_counter() - run.start
    run.setup.publish(
        TrainingDone(
            stop_reason,
            run.epoch,
            run.iteration,
            elapsed,
            output_iteration,
            run.images / elapsed if elapsed > 0 else 0.0,
            final_loss,
            (final_metrics or {}).get("accuracy"),
            final_metrics,
        )
    )
    return LoopResult(stop_reason, output_iteration, run.iteration)


# ---- pieces the loop uses ----------------------------------------------------------------------------------------


def _settled(setup: LoopSetup, model: nn.Module, data: BatchSource, autocast: object) -> tuple[LoopSetup, str]:
    """`setup` with mini_batch_size="auto" and learn_rate_scaling settled in its plan
    (nbscale.training.batch_fitting), and what was chosen and why ("" when nothing was)."""
    plan, device = setup.plan, setup.device
    auto = plan.batching.mini_batch_size == "auto"
    if not auto and plan.batching.learn_rate_scaling == "none":
        return setup, ""
    # the step as training runs it: the user's step_fn where given (mixup or distillation may need more memory)
    probe = (
        gpu_probe(model, data, plan.solver, plan.step.train, device, autocast, setup.seed)
        if device.type == "cuda"
        else no_probe
    )
    with untouched(model, device) if auto else contextlib.nullcontext():
        choices = settle(plan, setup.counts, len(data), setup.resume, probe, smallest_over(setup.group, device))
    return dataclasses.replace(setup, plan=choices.plan, counts=choices.counts), choices.said


def _read_every(setup: LoopSetup) -> int:
    """Most iterations between reads of the figures in one process (1: every iteration, for output_fn)."""
    return 1 if setup.read_each_iteration else READ_EVERY


def _distributed(
    model: nn.Module, setup: LoopSetup, share: float, metrics: KeptMetrics
) -> tuple[nn.Module, PoolFigures]:
    """`model` in DistributedDataParallel over the ranks with work, and the figures that travel with its
    gradients (nbscale.training.figures)."""
    from torch.nn.parallel import DistributedDataParallel

    device = setup.device
    net = DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None, process_group=setup.group
    )
    hook = CarryingHook(setup.group, share)
    net.register_comm_hook(None, hook.reduce)
    return net, PoolFigures(hook, setup.group, device, setup.stop_reason, metrics, setup.read_each_iteration)


def _trial(
    data: BatchSource,
    rows: torch.Tensor | list[torch.Tensor],
    seed: int,
    autocast: contextlib.AbstractContextManager[object],
    forward: Callable[..., tuple[torch.Tensor, Any]],
) -> Callable[[nn.Module], None]:
    """One forward and backward of a network on the first batch (whether a network compiles shows there)."""

    def trial(candidate: nn.Module) -> None:
        inputs, labels = next(iter(data.epoch(rows, seed)))
        with autocast:
            loss, _ = forward(candidate, inputs, labels)
        loss.backward()

    return trial


def _check_loss(loss: object, step_fn: Callable[..., Any] | None, iteration: int | None = None) -> None:
    """On the first iteration: the loss is one number with a gradient (shape only: no host sync); on a later one
    (`iteration`), that step_fn returned a tensor at all."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and (loss.requires_grad or iteration is not None):
        return
    if iteration is not None:
        raise OptionsError(
            f"step_fn returned {short_repr(loss)} at iteration {iteration} instead of the batch's loss (a scalar "
            "tensor with a gradient) or (loss, outputs): make it return the loss on every path (a missing return "
            "gives None)."
        )
    what = (
        "step_fn must return the batch's loss (a scalar tensor with a gradient) or (loss, outputs)"
        if step_fn is not None
        else "loss_fn must return the batch's mean loss (a scalar tensor with a gradient)"
    )
    got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
    raise OptionsError(
        f"{what}; it returned {got}: average the loss over the batch (e.g. .mean()), "
        "and compute it from the model's outputs."
    )
