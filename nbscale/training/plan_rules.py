"""The run plan's plain rules (nbscale.training.plan): how a run batches and validates, where it trains and in
what precision, when it checkpoints, and which listeners the notebook attaches. Each is a frozen record of values
TrainingOptions checked; the loop, the pool path and the display read these, never the options."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nbscale.errors import OptionsError
from nbscale.training.option_values import CompileMode
from nbscale.training.options import FACTORY_FIELDS, TrainingOptions, shown_choice


@dataclass(frozen=True)
class Batching:
    """How many epochs, how big a mini-batch and in what order; "auto" and "linear" are settled on the device
    (nbscale.training.batch_fitting.settle)."""

    max_epochs: int
    mini_batch_size: int | str  # a number, or "auto" until settled
    shuffle: str  # "once", "never", "every-epoch" (a DataLoader's own order: nbscale.data.loader_data)
    worker_load: tuple[float, ...] | None = None
    learn_rate_scaling: str = "none"
    learn_rate_reference_batch: int = 128


@dataclass(frozen=True)
class Placement:
    """Where and how the run trains: the execution environment, where the data are held, precision, compile."""

    environment: str = "auto"
    data_placement: str = "auto"
    dispatch_in_background: bool = False
    precision: str = "single"
    compile: bool | CompileMode = False

    @property
    def on_pool(self) -> bool:
        return self.environment in ("parallel", "multi-gpu")

    @property
    def replays_graphs(self) -> bool:
        """torch.compile modes that replay CUDA graphs, whose outputs live only until the next replay."""
        return self.compile in ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class ValidationRule:
    """How often the run validates, the patience of its objective and which network it returns."""

    frequency: int = 50
    patience: float = float("inf")
    output_network: str = "last-iteration"


@dataclass(frozen=True)
class CheckpointRule:
    """Where and how often checkpoints are written (the folder made absolute in the notebook, where the user looks:
    a cluster's workers may not have its relative form), and what a lost worker does."""

    path: str | None = None
    frequency: int = 1
    on_worker_failure: str = "error"

    def due(self, epoch: int) -> bool:
        """True when `epoch`'s end saves a checkpoint (every rank tells the same)."""
        return bool(self.path) and epoch % self.frequency == 0


@dataclass(frozen=True)
class Listeners:
    """What the notebook attaches to a run's events: the figure, the verbose table, output_fn and the loggers.

    Loggers and output_fn are live objects (open files, the user's closures): a pickled plan (a pool worker's, a
    train_async worker's) keeps only their descriptions, as the notebook's process alone runs them."""

    plot: bool = False  # plots="training-progress"
    verbose_frequency: int | None = 50  # None: no verbose table
    output_fn: Callable[[Any], Any] | None = None
    loggers: tuple[Any, ...] = ()
    logger_names: tuple[str, ...] = ()  # what each logger is, kept where the loggers are not

    @property
    def reads_each_iteration(self) -> bool:
        """output_fn reads every iteration's figures as it ends (on a pool every rank waits for its answer)."""
        return self.output_fn is not None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "output_fn": None, "loggers": ()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def batching(options: TrainingOptions, one_worker: bool = False) -> Batching:
    """OptionsError for a worker_load that splits the mini-batch where no pool trains. `one_worker`: a train_async
    or sweep run, trained whole on one pool worker, where worker_load does not apply."""
    on_pool = options.execution_environment in ("parallel", "multi-gpu")
    if one_worker:
        options = options.replace(worker_load=None)
    elif not on_pool and options.worker_load is not None and len(options.worker_load) != 1:
        raise OptionsError(
            f"worker_load={list(options.worker_load)} splits each mini-batch across a pool's workers, "
            f"but execution_environment={options.execution_environment!r} trains in this process: "
            "use execution_environment='parallel' (or 'multi-gpu'), or leave worker_load out."
        )
    load = None if options.worker_load is None else tuple(float(w) for w in options.worker_load)
    return Batching(
        int(options.max_epochs),
        options.mini_batch_size,
        options.shuffle,
        load,
        options.learn_rate_scaling,
        int(options.learn_rate_reference_batch),
    )


def placement(options: TrainingOptions) -> Placement:
    return Placement(
        options.execution_environment,
        options.data_placement,
        bool(options.dispatch_in_background),
        options.precision,
        options.compile,
    )


def validation_rule(options: TrainingOptions) -> ValidationRule:
    return ValidationRule(int(options.validation_frequency), options.validation_patience, options.output_network)


def checkpoint_rule(options: TrainingOptions, one_worker: bool = False) -> CheckpointRule:
    """OptionsError for on_worker_failure="restart" without what it needs (a pool, checkpoints to resume from).
    `one_worker`: a train_async or sweep run on one pool worker, which on_worker_failure does not apply to."""
    if one_worker:
        options = options.replace(on_worker_failure="error")
    if options.on_worker_failure == "restart" and options.execution_environment not in ("parallel", "multi-gpu"):
        raise OptionsError(
            f"on_worker_failure='restart' restarts the pool's workers, but execution_environment is "
            f"{options.execution_environment!r}: train on the pool (execution_environment='parallel' or 'multi-gpu'), "
            "or leave on_worker_failure at 'error'."
        )
    if options.on_worker_failure == "restart" and not options.checkpoint_path:
        raise OptionsError(
            "on_worker_failure='restart' resumes from the last checkpoint, so it needs checkpoint_path: give a "
            "folder, e.g. TrainingOptions(..., checkpoint_path='checkpoints', on_worker_failure='restart')."
        )
    path = options.checkpoint_path
    if path is not None and not os.path.isabs(os.path.expanduser(path)):
        # the notebook's folder now, where the user looks: a cluster's workers may not have it (they then run in
        # their own folder), and on_worker_failure="restart" looks here for what they wrote
        path = os.path.abspath(os.path.expanduser(path))
    return CheckpointRule(path, int(options.checkpoint_frequency), options.on_worker_failure)


def listeners(options: TrainingOptions) -> Listeners:
    loggers: Sequence[Any] = options.loggers or ()
    return Listeners(
        options.plots == "training-progress",
        int(options.verbose_frequency) if options.verbose else None,
        options.output_fn,
        tuple(loggers),
        tuple(type(logger).__name__ for logger in loggers),
    )


def recorded(options: TrainingOptions) -> dict[str, Any]:
    """The options as a checkpoint records them (a factory as "custom": check_resume compares solvers by that)."""
    return {
        k: shown_choice(v) if k in FACTORY_FIELDS else v
        for k, v in options.to_dict().items()
        if k not in ("validation_data", "output_fn", "loggers")
    }
