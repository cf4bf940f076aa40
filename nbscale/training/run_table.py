"""Training runs on the pool as a table of plain values: one row per run, and the order best first.

What `SweepResult.table()` and `to_dataframe()` return and what the sweep's live display shows
(nbscale.ui.sweep_display renders a RunsTable as text or HTML).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbscale.rendering import Rendered
from nbscale.training.options import TrainingOptions, field_names
from nbscale.training.runs import TrainingRun

if TYPE_CHECKING:
    from nbscale.training.info import TrainingInfo


def rank_key(run: TrainingRun) -> tuple[int, float]:
    """Sorts runs best first: by the final validation value of the run's objective_metric where it is a metric
    (its objective_goal says which way), else by final validation accuracy, else by final validation loss, else by
    final training loss; failed, cancelled and unfinished runs last."""
    if run.state != "done":
        return (2, 0.0)
    info = run.info
    final = info.final_validation
    name = (
        info.objective_metric
        if info.objective_metric != "loss"
        else "accuracy"
        if final.get("accuracy") is not None
        else "loss"
    )
    value = final.get(name)
    if value is not None:
        maximized = info.objective_goal == "maximize" if name == info.objective_metric else name == "accuracy"
        return (0, -value if maximized else value)
    loss = info.training_loss[-1] if info.training_loss else float("inf")
    return (1, loss)


def ranked(runs: Iterable[TrainingRun]) -> list[TrainingRun]:
    """`runs` best first (see `rank_key`)."""
    return sorted(runs, key=rank_key)


def run_row(run: TrainingRun) -> dict[str, Any]:
    """One table row: what a run is doing or how it ended."""
    info = run.info
    total = info.max_epochs * info.iterations_per_epoch
    elapsed = f"{info.time[-1]:.2f} s" if info.time else ""
    return {
        "run": run.name,
        "options": _options_text(run),
        "state": run.state,
        "epoch": f"{info.epoch[-1]} of {info.max_epochs}" if info.epoch else "",
        "iteration": f"{info.iteration[-1]} of {total}" if info.iteration else "",
        "training loss": _number(info.training_loss[-1] if info.training_loss else None),
        "validation loss": _number(info.final_validation_loss),
        **_metric_cells(info),
        "elapsed": elapsed,
        "data prepared in": f"{info.prepare_seconds:.2f} s" if info.data_placement else "",
        "error": last_line(run.error) if run.state == "failed" else "",
    }


def _metric_cells(info: TrainingInfo) -> dict[str, str]:
    """A training and a validation cell per metric (accuracy in %, as before; a regression run has no accuracy)."""
    cells: dict[str, str] = {}
    final = info.final_validation
    for name in info.metric_names:
        values = info.metrics.get(name, [])
        shown = _percent if name == "accuracy" else _number
        cells[f"training {name}"] = shown(values[-1] if values else None)
        cells[f"validation {name}"] = shown(final.get(name))
    return cells


@dataclass(frozen=True, repr=False)
class RunsTable(Rendered):
    """Runs in the order given, under a title; `rows()` are their current rows."""

    title: str
    runs: tuple[TrainingRun, ...]

    def rows(self) -> list[dict[str, Any]]:
        return [run_row(run) for run in self.runs]


# options that do not shape a run on one worker, or are no short value: left out of the options column
_NOT_SHOWN = (
    "validation_data",
    "output_fn",
    "plots",
    "verbose",
    "verbose_frequency",
    "execution_environment",
    "worker_load",
)
_ALWAYS_SHOWN = ("solver", "initial_learn_rate", "mini_batch_size", "max_epochs")


def _options_text(run: TrainingRun) -> str:
    """What a run trains with: the grid's values for a sweep's run; for a single run (`nbscale.show(run)`),
    the main options and every other one set away from its default."""
    if run.params:
        return ", ".join(f"{k}={v}" for k, v in run.params.items())
    options = getattr(run, "options", None)
    if options is None:
        return ""
    defaults = TrainingOptions(options.solver)
    changed = [
        name
        for name in field_names()
        if name not in _ALWAYS_SHOWN + _NOT_SHOWN and getattr(options, name) != getattr(defaults, name)
    ]
    return ", ".join(f"{name}={getattr(options, name)}" for name in (*_ALWAYS_SHOWN, *changed))


def last_line(error: str | None) -> str:
    """The last non-empty line of an error's text (its exception line)."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}%"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
