"""nbscale's Python API as users call it: the core's training and sweeps with their displays attached.

The core (nbscale.training) trains and emits events to the listeners it is given; this layer adds the listeners a
user asked for through the options: the training-progress plot (in notebooks), the verbose table and output_fn.
`%%train` only parses its line and calls `train_cell` here. The torch-heavy core and the ui modules load on
first use, so importing nbscale stays cheap.
"""

from __future__ import annotations

import keyword
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbscale.cellvars import names_bound
from nbscale.errors import NbscaleError, OptionsError
from nbscale.training.events import IterationDone, StopSignal
from nbscale.training.info import TrainingInfo
from nbscale.training.options import Environment, Solver, TrainingOptions, as_options, unwrap_form

if TYPE_CHECKING:
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from torch import nn

    from nbscale.pool.pool import Pool
    from nbscale.training.plan_rules import Listeners
    from nbscale.training.sweep import SweepResult

CELL_NAMES = ("model", "train_data", "val_data", "loss_fn", "step_fn", "make_model")


def train(
    model: nn.Module,
    train_data: object,
    options: TrainingOptions | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | str | None = None,
    resume_from: str | os.PathLike[str] | None = None,
    *,
    step_fn: Callable[..., Any] | None = None,
) -> tuple[nn.Module, TrainingInfo]:
    """Train `model` on `train_data` (a Dataset of (input, label) or a tuple of tensors); returns (net, info).

    `loss_fn(outputs, labels)` must average over the batch, or is a name `options.loss` takes ("mse", ...)
    (default: `options.loss`, cross-entropy when None).
    `step_fn(model, inputs, labels) -> loss | (loss, outputs)` replaces the forward and loss, in
    training and validation (given training=True/False when it has a `training` parameter). `resume_from` is a
    checkpoint file or a checkpoint_path folder (its newest checkpoint); training continues where it stopped
    with the same schedule and optimizer state. The returned net is `model`, trained in place (on a pool the
    trained weights are copied back). The Stop button, the kernel interrupt and output_fn returning True stop
    at the end of the current iteration; `info.stop_reason` says which.
    """
    from nbscale.training import trainer

    # checked and planned before anything is shown: every refusal comes first (nbscale.training.plan)
    checked = trainer.checked_inputs(model, train_data, as_options(options), loss_fn, step_fn)
    wanted = checked.plan.listeners
    info, stop = TrainingInfo(), StopSignal()
    listeners = training_listeners(wanted, info, stop)
    feed = None
    if wanted.loggers:
        from nbscale.loggers import LoggerFeed

        feed = LoggerFeed(wanted.loggers)
        listeners.insert(0, feed)  # before output_fn, whose failure ends the run
    try:
        return trainer.train_planned(model, checked, resume_from, listeners=listeners, stop=stop, info=info)
    finally:
        if feed is not None:  # however the run ended: what was logged is in the files
            feed.close()


def training_listeners(wanted: Listeners, info: TrainingInfo, stop: StopSignal) -> list[Callable[[Any], None]]:
    """The listeners the run plan asks for (nbscale.training.plan_rules.Listeners), in order: the plot (in a
    notebook), the verbose table, output_fn.

    `info` records each event before them (output_fn reads it); `stop` is the run's StopSignal.
    """
    listeners: list[Callable[[Any], None]] = []
    plot = wanted.plot and in_notebook()
    if plot:
        from nbscale.ui.progress import TrainingProgress

        listeners.append(TrainingProgress(stop))
    if wanted.verbose_frequency is not None:
        from nbscale.ui.verbose_table import VerboseTable

        listeners.append(VerboseTable(wanted.verbose_frequency, stop, preparing=not plot))
    if wanted.output_fn is not None:
        output_fn = wanted.output_fn

        def call_output_fn(event: object) -> None:
            if isinstance(event, IterationDone) and output_fn(info) is True:
                stop.request("Stopped by output_fn")

        listeners.append(call_output_fn)
    return listeners


def sweep(
    make_model: Callable[[], nn.Module] | nn.Module,
    train_data: object,
    options: TrainingOptions | None = None,
    grid: dict[str, Sequence[Any]] | None = None,
    pool: Pool | None = None,
    loss_fn: Callable[..., Any] | str | None = None,
    val_data: object = None,
    wait: bool = True,
    show: bool | None = None,
    seed: int | None = None,
    *,
    step_fn: Callable[..., Any] | None = None,
) -> SweepResult:
    """Train one network per combination of `grid` (option name -> list of values), each on its own worker.

    `make_model()` builds a fresh network per run (or pass a network: each run starts from a copy of it).
    `pool` defaults to the current pool (one is started if none runs). Every combination is checked before any
    run starts (OptionsError). In a notebook (or with `show=True`) a live figure compares the runs, with a Cancel
    button per run, and ends with the results table, best first. `wait=False` returns at once; `result.wait()`
    blocks later. Returns a SweepResult holding every run's net and info; failed runs keep their error.
    `seed` makes the runs reproducible (see nbscale.training.sweep.sweep); `loss_fn` and `step_fn` are train's.
    """
    from nbscale.training.sweep import sweep as start_sweep

    result = start_sweep(
        make_model,
        train_data,
        options,
        grid,
        pool=pool,
        loss_fn=loss_fn,
        val_data=val_data,
        wait=False,
        seed=seed,
        step_fn=step_fn,
    )
    try:
        if show if show is not None else in_notebook():
            from nbscale.ui.sweep_display import SweepDisplay

            runs, workers = len(result.runs), result.pool.size
            title = f"Sweep of {runs} run{'s' if runs != 1 else ''} on {workers} worker{'s' if workers != 1 else ''}"
            display = SweepDisplay(result.runs, title=title)
            display.show()
            result.on_end.append(display.finish)
    except KeyboardInterrupt:  # before its wait: as an interrupt during the wait, it cancels the runs
        result.cancel()
        if not wait:
            raise
    if wait:
        result.wait()
    return result


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where figures and widgets can show)."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# ---- %%train ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellTraining:
    """What a `%%train` line asks for: each flag, None where it was not given. Names are checked here."""

    options: str | None = None  # a notebook variable holding TrainingOptions or an options form
    environment: Environment | None = None
    epochs: int | None = None
    batch_size: int | str | None = None  # a number, or "auto"
    learn_rate: float | None = None
    solver: Solver | None = None
    plots: bool = True
    verbose: bool = True
    net: str = "net"
    info: str = "info"
    sweep: tuple[str, ...] = ()
    seed: int | None = None  # the sweep's seed

    def __post_init__(self) -> None:
        if self.seed is not None and not self.sweep:
            raise OptionsError(
                "--seed sets the seed of a sweep's runs, so it needs --sweep. For one run, call "
                "torch.manual_seed(N) in the cell before building the model."
            )
        for flag, name in (("--net", self.net), ("--info", self.info)):
            if not name.isidentifier():
                raise OptionsError(
                    f"{flag} {name}: the name for the result must be a Python identifier, such as {flag} trained."
                )
            if keyword.iskeyword(name):
                raise OptionsError(
                    f"{flag} {name}: {name!r} is a Python keyword, which no variable can be named; "
                    f"pick another name, such as {flag} trained."
                )
        if self.net == self.info:
            raise OptionsError(
                f"--net and --info both name {self.net!r}: the info would replace the network. "
                "Give them different names, such as --net net --info info."
            )


def train_cell(shell: Any, cell: str, request: CellTraining) -> None:
    """Run `cell` in the notebook, then train its `model` on its `train_data` (and `val_data`): `%%train`.

    The cell must define `model` and `train_data` (with --sweep, `make_model` may stand for `model`); it may
    define `val_data`, `loss_fn` and `step_fn`. Only what this cell assigns counts, not what earlier cells left. Flags
    override the options; afterwards the network and the info are notebook variables (`request.net`,
    `request.info`), and with --sweep every run is in `sweep_result`.
    """
    namespace = shell.user_ns
    before = {name: namespace[name] for name in CELL_NAMES if name in namespace}
    outcome = shell.run_cell(cell)
    if not outcome.success:  # its traceback is shown above; the cell must still fail (Run All stops here)
        raise NbscaleError("The %%train cell raised the error above, so nothing was trained.")
    # only what this cell defined counts: a val_data or loss_fn left from an earlier cell must not leak in
    defined = _assigned_names(shell, cell) | {
        name for name in CELL_NAMES if name in namespace and namespace[name] is not before.get(name)
    }
    del before  # the earlier values (an old network) are not kept alive through training
    values = {name: namespace[name] for name in CELL_NAMES if name in defined and name in namespace}
    sweeping = bool(request.sweep) and callable(values.get("make_model"))
    needed = ("train_data",) if sweeping else ("model", "train_data")
    missing = [name for name in needed if name not in values]
    if missing:
        earlier = [name for name in missing if name in namespace]
        plural = len(earlier) > 1
        note = (
            f" ({' and '.join(earlier)} from an earlier cell {'are' if plural else 'is'} not used: assign "
            f"{'them' if plural else 'it'} in this cell)"
            if earlier
            else ""
        )
        raise OptionsError(
            f"The %%train cell must define {' and '.join(missing)}{note}; it may define val_data and loss_fn too."
        )
    options = _cell_options(request, namespace, values.get("val_data", _NOT_ASSIGNED))
    if request.sweep:
        _sweep_cell(request, values, options, namespace)
        return
    net, info = train(
        values["model"], values["train_data"], options, loss_fn=values.get("loss_fn"), step_fn=values.get("step_fn")
    )
    namespace[request.net], namespace[request.info] = net, info


def _sweep_cell(
    request: CellTraining, values: dict[str, Any], options: TrainingOptions, namespace: dict[str, Any]
) -> None:
    """`%%train --sweep`: every run in `sweep_result`, the best one's network and info in the notebook."""
    from nbscale.training.sweep import parse_grid

    make_model = values.get("make_model")
    result = sweep(
        make_model if callable(make_model) else values["model"],
        values["train_data"],
        options,
        parse_grid(request.sweep),
        loss_fn=values.get("loss_fn"),
        seed=request.seed,
        step_fn=values.get("step_fn"),
    )
    namespace["sweep_result"] = result
    if result.best is not None:
        namespace[request.net], namespace[request.info] = result.best.net, result.best.info


def _assigned_names(shell: InteractiveShell, cell: str) -> set[str]:
    """The CELL_NAMES the cell's code binds in the notebook (`x = x`, `def loss_fn`, imports count; names bound
    inside functions and classes do not)."""
    try:
        return names_bound(shell.transform_cell(cell)) & set(CELL_NAMES)
    except SyntaxError:
        return set()


_NOT_ASSIGNED = object()  # the cell did not assign val_data (None: it did, to train without validation)


def _cell_options(request: CellTraining, namespace: dict[str, Any], val_data: object) -> TrainingOptions:
    """The options of --options (or the defaults, with the training-progress plot), with the flags applied and
    the cell's `val_data` (`_NOT_ASSIGNED` when it assigned none) as the validation data."""
    if request.options is not None:
        if request.options not in namespace:
            raise OptionsError(
                f"--options {request.options}: no notebook variable named {request.options!r}. Create "
                f"it in an earlier cell: {request.options} = nbscale.TrainingOptions('sgdm', ...), or "
                f"{request.options} = nbscale.options_form() for a form."
            )
        base = unwrap_form(namespace[request.options])
        if not isinstance(base, TrainingOptions):
            kind = type(base).__name__
            kind = f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"
            raise OptionsError(
                f"--options {request.options}: {request.options} holds {kind}, not "
                f"TrainingOptions or an options form: set {request.options} = "
                "nbscale.TrainingOptions('sgdm', ...) (or nbscale.options_form()), or name another "
                "variable."
            )
    else:
        base = TrainingOptions(request.solver or "sgdm", plots="training-progress")
    flags = {
        "execution_environment": request.environment,
        "max_epochs": request.epochs,
        "mini_batch_size": request.batch_size,
        "initial_learn_rate": request.learn_rate,
        "solver": request.solver,
    }
    changes: dict[str, Any] = {field: value for field, value in flags.items() if value is not None}
    if not request.plots:
        changes["plots"] = "none"
    if not request.verbose:
        changes["verbose"] = False
    if val_data is not _NOT_ASSIGNED:  # the cell's own val_data wins over the options', None too
        changes["validation_data"] = val_data
    return base.replace(**changes) if changes else base
