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
import dataclasses
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbscale.data.batches import batch_length
from nbscale.data.loader_data import loader_of
from nbscale.data.loader_order import LoaderBatches, MatlabBatches, make_epoch_batches, validation_order
from nbscale.data.loading import BatchSource, make_batch_source
from nbscale.data.preparing import Progress, Readers
from nbscale.data.streaming import StreamBatches
from nbscale.errors import OptionsError
from nbscale.training.batch_fitting import gpu_probe, no_probe, out_of_memory, settle, smallest_over, untouched
from nbscale.training.checkpoint import prepare_folder, save_checkpoint
from nbscale.training.checks import misfit_error
from nbscale.training.compiling import compiled_network
from nbscale.training.events import IterationDone, PreparingData, TrainingDone, TrainingStarted
from nbscale.training.figures import READ_EVERY, CarryingHook, Figures, KeptMetrics, LocalFigures, Pending, PoolFigures
from nbscale.training.layout import layout_restored, train_channels_last
from nbscale.training.optimizer import make_optimizer
from nbscale.training.options import FACTORY_FIELDS, TrainingOptions, shown_choice
from nbscale.training.plan import RunPlan
from nbscale.training.run_metrics import Objective, run_metrics, summed_over
from nbscale.training.schedules import Schedule, base_rate, make_schedule
from nbscale.training.steps import short_repr
from nbscale.user_warnings import warn_user


@dataclass
class LoopSetup:
    """Everything one process needs to run the loop."""

    model: nn.Module
    train_data: Any  # a Dataset
    options: TrainingOptions
    plan: RunPlan  # the run's resolved choices (nbscale.training.plan): the step, the plateau's input
    device: torch.device
    seed: int
    hardware: str
    publish: Callable[[Any], None]  # the event channel (rank 0) or a no-op
    stop_reason: Callable[[], str | None]  # polled at the end of each iteration
    validation_data: Any = None
    resume: dict[str, Any] | None = None
    counts: list[int] = field(default_factory=lambda: [0])  # samples per rank in each global batch
    rank: int = 0
    group: torch.distributed.ProcessGroup | None = None  # the ranks with work, when more than one has; else None
    is_main: bool = True  # writes checkpoints
    # tells the user what the run changed or why it ended (a RuntimeWarning here; a pool's main rank sends them
    # to the notebook, which warns there once, at the user's line); None on a pool's other ranks
    warn: Callable[[str], None] | None = field(default=lambda message: warn_user(message, RuntimeWarning))
    # a listener needs every iteration's figures at once (output_fn; on a pool publish waits for its answer)
    read_each_iteration: bool = False


def loop_setup(
    model: nn.Module,
    train_data: Any,
    options: TrainingOptions,
    plan: RunPlan,
    *,
    device: torch.device,
    seed: int,
    hardware: str,
    publish: Callable[[Any], None],
    stop_reason: Callable[[], str | None],
    counts: list[int],
    **where: Any,
) -> LoopSetup:
    """The one place a LoopSetup is built: in the notebook (trainer), on each pool rank (distributed) and on a
    train_async worker (runs). The validation data are the options'; `plan` is the one made before training
    (trainer.checked_inputs); `where` holds what differs by place (resume, rank, group, is_main, warn,
    read_each_iteration)."""
    return LoopSetup(
        model=model,
        train_data=train_data,
        options=options,
        plan=plan,
        device=device,
        seed=seed,
        hardware=hardware,
        publish=publish,
        stop_reason=stop_reason,
        validation_data=options.validation_data,
        counts=counts,
        **where,
    )


@dataclass
class LoopResult:
    stop_reason: str
    state_dict: dict[str, torch.Tensor]
    output_network_iteration: int
    iteration: int
    warnings: list[str] = field(default_factory=list)  # on a pool, what the notebook must warn of


def run_training(setup: LoopSetup) -> LoopResult:
    """Train `setup.model` in place; returns the output network's state and why training ended."""
    with (
        _cheap_garbage_collection(),
        layout_restored(setup.model),
        _cudnn_setting_restored(),
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


@dataclass(eq=False)
class _Run:
    """What the loop's parts share: the variants chosen in setup, then the run's counters."""

    setup: LoopSetup
    model: nn.Module
    net: nn.Module  # the model, in DDP and/or compiled
    data: BatchSource
    validation: _Validator | None
    forward: Callable[[nn.Module, Any, Any], tuple[torch.Tensor, Any]]  # forward + loss, or step_fn
    autocast: Any
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    clip: Callable[[], None]
    figures: Figures  # how the figures are kept and read (one process, or with DDP's hook)
    reading: _ReadRule  # when they are read
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
    # the best validation so far by the objective's score (lower is better: Objective.score)
    best: dict[str, Any] = field(default_factory=lambda: {"score": math.inf, "iteration": 0, "state": None, "bad": 0})
    pending: list[Pending] = field(default_factory=list)
    first_iteration: int = 1  # a failure of its step is the network not fitting the data (misfit_error)
    start: float = 0.0
    stop_reason: str | None = None

    @property
    def options(self) -> TrainingOptions:
        return self.setup.options

    @property
    def max_epochs(self) -> int:
        return int(self.setup.options.max_epochs)


# ---- setup: every variant chosen once --------------------------------------------------------------------------


def _set_up(setup: LoopSetup, closing: contextlib.ExitStack) -> _Run:
    """The data held where training runs, precision, layout, the settled batch, the solver and schedule, DDP,
    compile, the metrics and how the figures are read."""
    model = setup.model.to(setup.device)
    data, validation, autocast_dtype, scaler, started = _held_data(setup, model, closing)
    device = setup.device
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    train_channels_last(model, device, _first_input(data, setup.seed), autocast)  # undone by layout_restored
    _autotune_convolutions(device)  # after the layout check's one-sample pass: no tuning for its shapes
    # mini_batch_size="auto" (a probe of the GPU, with the data in place) and learn_rate_scaling, settled
    setup, started["choices"] = _settled(setup, model, data, autocast)
    options = setup.options
    if validation is not None:
        validation.split(validation_batch(setup.validation_data, max(setup.counts)))
    global_batch, local = sum(setup.counts), setup.counts[setup.rank]
    # a DataLoader's batches as iterating it gives them; MATLAB's (the last partial mini-batch dropped) otherwise
    batches = make_epoch_batches(setup.train_data, len(data), options.shuffle, setup.seed, setup.counts, setup.rank)
    iterations_per_epoch = batches.iterations
    optimizer = make_optimizer(model, options)
    forward = setup.plan.step.train  # (net, inputs, labels) -> (loss, outputs or None)
    # the metrics (options.metrics, or the default its loss and targets give) and what patience follows
    metric_set = run_metrics(options, setup.plan.loss_fn, setup.train_data)
    metrics, objective = KeptMetrics(metric_set, options.metrics is not None), Objective(options, metric_set)
    net, figures = _network_and_figures(setup, model, metrics, local / global_batch)
    if options.compile:  # tried on the first batch: a network that cannot compile trains eagerly, with a warning
        trial = _trial(data, batches.first_rows(), setup.seed, autocast, forward)
        net = compiled_network(net, options.compile, trial, model, device, warn=setup.warn)
    reading = _ReadRule(
        figures, options.validation_frequency, iterations_per_epoch * int(options.max_epochs), validation is not None
    )
    return _Run(
        setup,
        model,
        net,
        data,
        validation,
        forward,
        autocast,
        scaler,
        optimizer,
        make_schedule(options, optimizer, iterations_per_epoch),
        _clipping(model, optimizer, scaler, options),
        figures,
        reading,
        metrics,
        objective,
        iterations_per_epoch,
        global_batch,
        started,
        batches=batches,
    )


def _held_data(
    setup: LoopSetup, model: nn.Module, closing: contextlib.ExitStack
) -> tuple[BatchSource, _Validator | None, Any, torch.amp.GradScaler, dict[str, Any]]:
    """The data, read and held where training runs (on a pool each rank reads a block and they share them), before
    the clock starts (info.prepare_seconds, not training time): (training batches, validator, autocast dtype,
    scaler, what TrainingStarted says of them)."""
    options = setup.options
    autocast_dtype, scaler = _precision(options.precision, setup.device, setup.warn)  # the scaler scales fp16 losses
    preparing = time.perf_counter()
    readers = _readers(setup)
    # the option, or the datastore's own flag (MATLAB's augmentedImageDatastore DispatchInBackground)
    background = options.dispatch_in_background or getattr(setup.train_data, "dispatch_in_background", False) is True
    data = make_batch_source(
        setup.train_data,
        setup.device,
        options.data_placement,
        background,
        seed=_loader_seed(setup),
        readers=readers,
        progress=_progress(setup, "training data", setup.train_data),
        warn=setup.warn,
    )
    if isinstance(data, StreamBatches):
        closing.callback(data.close)
    validation = _Validator(setup, model, autocast_dtype) if setup.validation_data is not None else None
    started = {"prepare_seconds": time.perf_counter() - preparing, "data_placement": _placement(data, readers)}
    return data, validation, autocast_dtype, scaler, started


def _network_and_figures(
    setup: LoopSetup, model: nn.Module, metrics: KeptMetrics, share: float
) -> tuple[nn.Module, Figures]:
    """The network the step calls and how the figures are kept and read: on several ranks with work, DDP with the
    figures summed with the last gradient bucket; else the model and the figures read in this process."""
    if setup.group is not None:
        return _distributed(model, setup, share, metrics)
    return model, LocalFigures(setup.stop_reason, _read_every(setup), _graphs(setup.options), metrics)


class _ReadRule:
    """When the loop reads the figures (nbscale.training.figures): a bunch is full, this iteration needs its figures
    now (validation, the last iteration, a checkpoint, a stop asked), an epoch ends, or the interval passed."""

    def __init__(self, figures: Figures, validation_frequency: int, total_iterations: int, validating: bool) -> None:
        self.figures, self.frequency, self.total, self.validating = (
            figures,
            validation_frequency,
            total_iterations,
            validating,
        )
        self.last_read = time.perf_counter()

    def validation_due(self, iteration: int) -> bool:
        return iteration == 1 or iteration % self.frequency == 0 or iteration == self.total

    def needed(self, iteration: int, asked: bool, due: bool, checkpoint: bool) -> bool:
        """True when this iteration's own figures must be read now (the read waits for them)."""
        return asked or (self.validating and due) or iteration == self.total or checkpoint

    def now(self, unread: int, needed: bool, epoch_end: bool) -> bool:
        """True when the figures are read after this iteration (a read reports the bunch before)."""
        now = time.perf_counter()
        if not (
            unread >= self.figures.read_every or needed or epoch_end or now - self.last_read >= self.figures.interval
        ):
            return False
        self.last_read = now
        return True


# ---- the run: start, epochs, steps, reports, end ---------------------------------------------------------------


def _start(run: _Run) -> None:
    """Restore a checkpoint's state, then tell the listeners what this run is (a resumed run: its history)."""
    setup, options = run.setup, run.options
    if setup.resume is not None:
        run.batches.skip(int(setup.resume["epoch"]))  # before the global stream is restored: it draws from it
        run.epoch, run.iteration, run.history, run.best = _restore(
            setup.resume, run.model, run.optimizer, run.scaler, run.schedule
        )
        run.best.setdefault("score", run.best.pop("loss", math.inf))  # a checkpoint from before the objective
    if setup.is_main and options.checkpoint_path:
        prepare_folder(options.checkpoint_path)
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
    setup, options = run.setup, run.options
    rows = run.batches.rows(run.epoch)
    run.model.train()
    for step, (inputs, labels) in enumerate(run.data.epoch(rows, _epoch_seed(setup.seed, run.epoch)), 1):
        _step(run, inputs, labels, run.batches.sizes[step - 1])
        epoch_end = step == len(rows)
        due = run.reading.validation_due(run.iteration)
        asked = run.figures.stop_asked()
        needed = run.reading.needed(run.iteration, asked, due, epoch_end and _checkpoint_due(options, run.epoch))
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
    run.schedule.after_validation(run.setup.plan.plateau_value(validation_loss, validation_metrics))
    improved = _best_updated(
        run.best, run.objective.score(validation_loss, validation_metrics), iteration, run.model, run.options
    )
    if run.stop_reason is None:
        run.stop_reason = _objective_nan(run.objective, validation_metrics, iteration)
    if not improved and run.best["bad"] >= run.options.validation_patience and run.stop_reason is None:
        run.stop_reason = _patience_met(run.options, run.objective)
    run.model.train()
    return validation_loss, validation_metrics


def _end_epoch(run: _Run) -> None:
    """The schedule's epoch step, and a checkpoint (complete epochs only, so resume continues with no lost or
    repeated epoch)."""
    if run.stop_reason is not None:
        return
    run.schedule.after_epoch()
    setup, options = run.setup, run.options
    if setup.is_main and options.checkpoint_path and _checkpoint_due(options, run.epoch):
        save_checkpoint(
            options.checkpoint_path,
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
                "best": run.best,
                "rng": torch.get_rng_state(),
                "options": _plain_options(options),
                "samples": len(setup.train_data),
            },
        )


def _finish(run: _Run) -> LoopResult:
    """The output network and the TrainingDone event.

    A stop asked while an iteration's event went out (output_fn, the Stop button) ends the run after that
    iteration, which was not validated: it is validated now, so the final figures are the returned network's.
    """
    final_loss, final_metrics = None, None
    history, model, options = run.history, run.model, run.options
    if (
        run.validation is not None
        and history
        and history[-1].validation_loss is None
        and math.isfinite(history[-1].training_loss)
    ):
        final_loss, final_metrics = run.validation.evaluate(run.metrics)
        _best_updated(run.best, run.objective.score(final_loss, final_metrics), run.iteration, model, options)
    stop_reason = run.stop_reason or "Max epochs completed"
    output_iteration = run.iteration
    if options.output_network == "best-validation" and run.best["state"] is not None:
        model.load_state_dict(run.best["state"])
        output_iteration = run.best["iteration"]
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
    return LoopResult(stop_reason, _cpu_copy(model.state_dict()), output_iteration, run.iteration)


# ---- pieces the loop uses ----------------------------------------------------------------------------------------


def _best_updated(
    best: dict[str, Any], score: float, iteration: int, model: nn.Module, options: TrainingOptions
) -> bool:
    """Count a validation's `score` (lower is better) against the best so far; True when it is the new best
    (kept as the output network under output_network="best-validation"), else one more validation without."""
    if not score < best["score"]:  # NaN (no value) is never better
        best["bad"] += 1
        return False
    best.update(score=score, iteration=iteration, bad=0)
    if options.output_network == "best-validation":
        best["state"] = _cpu_copy(model.state_dict())
    return True


def _objective_nan(objective: Objective, metrics: dict[str, float | None], iteration: int) -> str | None:
    """The stop reason when the objective metric's validation value is NaN (a metric that divides by zero, say):
    its patience would count it as no improvement and stop as if the criterion were met."""
    value = metrics.get(objective.name)
    if objective.name == "loss" or value is None or not math.isnan(value):
        return None
    return (
        f"Stopped: objective_metric={objective.name!r} was NaN at the validation of iteration {iteration}; make the "
        "metric return a number for every validation set, or pick another objective_metric"
    )


def _patience_met(options: TrainingOptions, objective: Objective) -> str:
    """The stop reason once validation_patience validations in a row did not improve the objective."""
    if objective.name == "loss":
        return f"Met validation criterion (validation_patience={options.validation_patience})"
    return (
        f"Met validation criterion (validation_patience={options.validation_patience}, "
        f"objective_metric={objective.name!r})"
    )


@contextlib.contextmanager
def _cheap_garbage_collection() -> Iterator[None]:
    """Keep the garbage collector's passes short and rare while training runs; restored afterwards.

    - The objects that exist before training are frozen out of full passes: a notebook's heap (matplotlib,
      pandas, a kernel's history) is often large, and a full pass over it stalls a random iteration. A heap the
      user froze is left as it is.
    - The youngest generation is collected every YOUNG_COLLECTION_THRESHOLD new objects instead of 700: each
      iteration makes a few objects that live on (its history entry), and frequent young passes kept scanning
      them, a cost paid every iteration that shows on a small network.
    """
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_THRESHOLD), *threshold[1:])
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*threshold)


YOUNG_COLLECTION_THRESHOLD = 10_000


@contextlib.contextmanager
def _cudnn_setting_restored() -> Iterator[None]:
    benchmark = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark


def _autotune_convolutions(device: torch.device) -> None:
    """On a GPU, cuDNN times its convolution algorithms on the first batches and keeps the fastest (worth it:
    training batches keep one shape), as a hand-written loop sets `cudnn.benchmark`; left alone where the user
    asked for deterministic algorithms. Restored after training (`_cudnn_setting_restored`)."""
    if device.type == "cuda" and not torch.backends.cudnn.deterministic:
        torch.backends.cudnn.benchmark = True


def _settled(setup: LoopSetup, model: nn.Module, data: BatchSource, autocast: object) -> tuple[LoopSetup, str]:
    """`setup` with mini_batch_size="auto" and learn_rate_scaling settled (nbscale.training.batch_fitting), and what
    was chosen and why ("" when nothing was)."""
    options, device = setup.options, setup.device
    if options.mini_batch_size != "auto" and options.learn_rate_scaling == "none":
        return setup, ""
    # the step as training runs it: the user's step_fn where given (mixup or distillation may need more memory)
    forward = setup.plan.step.train
    probe = (
        gpu_probe(model, data, options, forward, device, autocast, setup.seed) if device.type == "cuda" else no_probe
    )
    with untouched(model, device) if options.mini_batch_size == "auto" else contextlib.nullcontext():
        choices = settle(options, setup.counts, len(data), setup.resume, probe, smallest_over(setup.group, device))
    return dataclasses.replace(setup, options=choices.options, counts=choices.counts), choices.said


def _readers(setup: LoopSetup) -> Readers | None:
    """On a pool with several ranks with work: those ranks, which read the training data together (each a block
    of it, then they share what they read: nbscale.data.preparing); else None."""
    if setup.group is None:
        return None
    active = [rank for rank, count in enumerate(setup.counts) if count > 0]
    return Readers(active.index(setup.rank), len(active), setup.group, setup.device)


def _progress(setup: LoopSetup, what: str, data: Any) -> Progress:
    """Counts the items of `data` this process reads before training, told as PreparingData events: done by this
    process, of all the items (on a pool the notebook adds the ranks' counts up)."""
    unit = "files" if getattr(data, "files", None) else "items"
    whole = len(data)

    def report(done: int, total: int) -> None:
        setup.publish(PreparingData(what, done, whole, unit))

    return Progress(report)


def _placement(data: BatchSource, readers: Readers | None) -> str:
    """Where the training data are held, for the info panel (`info.data_placement`)."""
    if readers is None or not isinstance(data, StreamBatches):
        return data.description
    return f"{data.description} on each of {readers.count} workers, each reading its share of every mini-batch"


def _first_input(data: BatchSource, seed: int) -> Callable[[], torch.Tensor]:
    """The first sample's input as a batch of one, from where the data are held (no file is read again)."""

    def first() -> torch.Tensor:
        inputs, _ = next(iter(data.epoch(torch.zeros((1, 1), dtype=torch.long), seed)))
        return inputs

    return first


def _checkpoint_due(options: TrainingOptions, epoch: int) -> bool:
    """True when `epoch`'s end saves a checkpoint (every rank tells the same)."""
    return bool(options.checkpoint_path) and epoch % options.checkpoint_frequency == 0


def _read_every(setup: LoopSetup) -> int:
    """Most iterations between reads of the figures in one process (1: every iteration, for output_fn)."""
    return 1 if setup.read_each_iteration else READ_EVERY


def _graphs(options: TrainingOptions) -> bool:
    """True for torch.compile modes that replay CUDA graphs, whose outputs live only until the next replay."""
    return options.compile in ("reduce-overhead", "max-autotune")


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


def _loader_seed(setup: LoopSetup) -> int:
    """The seed of a DataLoader's own random stream: a rank's background processes draw other numbers than
    another rank's."""
    return (setup.seed * 1_000_003 + setup.rank) % 2**62


def _epoch_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's random augmentation: a pure function, so resume and every rank draw the same."""
    return (seed * 1_000_003 + epoch) % 2**62


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


def validation_batch(validation_data: Any, training_batch: int) -> int:
    """Each rank's validation batch: a validation DataLoader's batch_size (TrainingOptions has no validation batch
    size), else `training_batch`, a rank's training batch (which fits, so this does)."""
    loader = loader_of(validation_data)
    return loader.batch_size if loader is not None else training_batch


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


def _clipping(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, options: TrainingOptions
) -> Callable[[], None]:
    """The gradient clipping of every iteration (MATLAB's gradient_threshold), or a function doing nothing."""
    threshold, method = float(options.gradient_threshold), options.gradient_threshold_method
    if math.isinf(threshold):
        return _no_clipping

    def clip() -> None:
        scaler.unscale_(optimizer)  # clip the true gradients (does nothing without loss scaling)
        clip_gradients(model, method, threshold)

    return clip


def _no_clipping() -> None:
    pass


def clip_gradients(model: nn.Module, method: str, threshold: float) -> None:
    """MATLAB's gradient clipping: per-parameter L2 norm, global L2 norm, or element-wise absolute value."""
    with_gradients = [p for p in model.parameters() if p.grad is not None]
    if not with_gradients:
        return
    if method == "global-l2norm":
        torch.nn.utils.clip_grad_norm_(with_gradients, threshold)
    elif method == "absolute-value":
        torch.nn.utils.clip_grad_value_(with_gradients, threshold)
    else:  # "l2norm": each parameter's gradient on its own (torch has no public per-tensor clip in one launch)
        grads = [p.grad for p in with_gradients if p.grad is not None]  # all are; this narrows the type
        norms = torch._foreach_norm(grads)
        factors = [torch.clamp(threshold / (n + 1e-12), max=1.0) for n in norms]
        torch._foreach_mul_(grads, factors)


class _Validator:
    """Loss and metrics over the validation data (their states summed over the batches and the ranks), with the
    plain network in eval mode (never the compiled one: its last smaller batch and eval mode would compile it
    again); on a pool each rank takes every k-th sample, with the main rank's buffers (the network the user gets
    back: see `_take_main_ranks_buffers`)."""

    def __init__(self, setup: LoopSetup, model: nn.Module, autocast_dtype: Any) -> None:
        from nbscale.data.loading import as_dataset

        self.setup, self.model, self.autocast_dtype = setup, model, autocast_dtype
        data = as_dataset(setup.validation_data, "validation_data")
        active = sum(1 for c in setup.counts if c > 0)
        position = sum(1 for c in setup.counts[: setup.rank] if c > 0)
        # the samples a validation DataLoader gives (its sampler, its drop_last); each rank reads and holds only
        # the samples it validates
        order = validation_order(data)
        if active > 1:
            # torch's Dataset declares no __len__; as_dataset checked it
            order = (torch.arange(len(data)) if order is None else order)[position::active]  # type: ignore[arg-type]
        rows = order
        self.source: BatchSource | None = None
        self.batches: list[torch.Tensor] = []
        if rows is None or len(rows):
            self.source = make_batch_source(
                data,
                setup.device,
                setup.options.data_placement,
                False,
                seed=_loader_seed(setup),
                rows=rows,
                progress=_progress(setup, "validation data", data),
            )

    def split(self, batch: int) -> None:
        """Validate in batches of `batch` samples (once the training's mini-batch is settled)."""
        if self.source is not None:
            self.batches = list(torch.split(torch.arange(len(self.source)), batch))

    @torch.no_grad()
    def evaluate(self, metrics: KeptMetrics) -> tuple[float, dict[str, float | None]]:
        """(validation loss, each metric's value): one read to the host, after one all_reduce on a pool."""
        if self.setup.group is not None:
            _take_main_ranks_buffers(self.model, self.setup.group)
        self.model.eval()
        device = self.setup.device
        totals = torch.zeros(2 + metrics.size, device=device)  # loss sum, samples, the metrics' summed state
        # the same augmentation draws at every validation, so its figures compare over the run
        for inputs, labels in self.source.epoch(self.batches, self.setup.seed) if self.source is not None else ():
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                loss, outputs = self.setup.plan.step.validate(self.model, inputs, labels)  # or the user's step_fn
            count = batch_length(labels)
            totals[0] += loss.float() * count
            totals[1] += count
            if metrics.size and outputs is not None:
                totals[2:] += metrics.metrics.state(outputs, labels).to(device)
        loss_sum, count, *state = summed_over(self.setup.group, totals).tolist()
        return loss_sum / max(count, 1), metrics.values(state)


def _take_main_ranks_buffers(model: nn.Module, group: torch.distributed.ProcessGroup | None) -> None:
    """Every rank's buffers (BatchNorm's running statistics) become the main rank's, in place.

    Each rank's running statistics follow its own share of the data, while the network returned (and written to
    checkpoints) is the main rank's: validating with these makes the figures those of the returned network.
    Training is unchanged, since DistributedDataParallel itself broadcasts the main rank's buffers at the start of
    every forward pass (broadcast_buffers).
    """
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, group=group, group_src=0)  # the group's rank 0 is the main rank


def _precision(
    precision: str, device: torch.device, warn: Callable[[str], None] | None
) -> tuple[torch.dtype | None, torch.amp.GradScaler]:
    """(autocast dtype or None, GradScaler): bf16 where the GPU has it, else fp16 with loss scaling; the scaler
    is enabled only for fp16 (disabled, it passes the loss and the step through, as in nanoGPT)."""
    if precision == "mixed" and device.type != "cuda" and warn is not None:
        warn("precision='mixed' only speeds up GPUs; training on the CPU in single precision.")
    if precision != "mixed" or device.type != "cuda":
        return None, torch.amp.GradScaler(device.type, enabled=False)
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, torch.amp.GradScaler("cuda", enabled=False)
    return torch.float16, torch.amp.GradScaler("cuda")


def _restore(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    schedule: Any,
) -> tuple[int, int, list[IterationDone], dict[str, Any]]:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state.get("schedule") or {})
    if state.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return state["epoch"], state["iteration"], list(state["history"]), dict(state["best"])


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def _plain_options(options: TrainingOptions) -> dict[str, Any]:
    # a factory is kept as "custom" (check_resume compares solvers by that name)
    return {
        k: shown_choice(v) if k in FACTORY_FIELDS else v
        for k, v in options.to_dict().items()
        if k not in ("validation_data", "output_fn")
    }
