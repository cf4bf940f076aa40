"""`nbscale.sweep`: train one network per combination of option values, each on its own pool worker.

MATLAB's "Train multiple networks in parallel" (parfeval per network). Every combination is checked before any
run starts; runs queue for free workers; a failing run keeps its error while the others keep going; cancelling a
run frees its worker for the next one. The figure that compares the runs is nbscale.notebook's (it adds it).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_for_futures
from typing import Any

from torch import nn

from nbscale.errors import OptionsError
from nbscale.rendering import Rendered
from nbscale.training.options import TrainingOptions, as_options, field_names
from nbscale.training.run_table import RunsTable, ranked
from nbscale.training.runs import TrainingRun, fresh_model, seeded_model, submit_run


def grid_combinations(grid: dict[str, Sequence[Any]] | None) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first field varying slowest; OptionsError for a bad grid."""
    if grid is None or grid == {}:
        raise OptionsError(
            "nbscale.sweep needs grid=, the options to vary: a dict of option name -> list of values, "
            "e.g. grid={'initial_learn_rate': [0.01, 0.1]} (one run per combination). To train one "
            "network with the options as they are, use nbscale.train."
        )
    if not isinstance(grid, dict):
        raise OptionsError(
            "grid must be a dict of option name -> list of values, e.g. {'initial_learn_rate': [0.01, 0.1]}."
        )
    names = field_names()
    for name, values in grid.items():
        if name not in names:
            TrainingOptions("sgdm", **{name: None})  # raises the usual "no field ... did you mean" error
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
            raise OptionsError(f"grid[{name!r}] must be a non-empty list of values, not {values!r}.")
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


class SweepResult(Rendered):
    """Every run of a sweep: `runs` (TrainingRun futures), `nets`, `infos`, `best`, `table()`, `cancel(i)`.

    Shows as its results table, best first. `on_end` holds callables called once `wait()` saw every run end.
    """

    def __init__(self, runs: list[TrainingRun], pool: Any) -> None:
        self.runs = runs
        self.pool = pool
        self.on_end: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self.runs)

    def __getitem__(self, index: int) -> TrainingRun:
        return self.runs[index]

    @property
    def done(self) -> bool:
        return all(run.done() for run in self.runs)

    @property
    def nets(self) -> list[nn.Module | None]:
        """The trained network of each run (None for a run that failed, was cancelled, or still runs)."""
        return [run.net for run in self.runs]

    @property
    def infos(self) -> list[Any]:
        """Each run's TrainingInfo (live while it trains)."""
        return [run.info for run in self.runs]

    @property
    def best(self) -> TrainingRun | None:
        """The finished run ranked first by `ranked()`, or None when none finished."""
        finished = [run for run in self.ranked() if run.state == "done"]
        return finished[0] if finished else None

    def ranked(self) -> list[TrainingRun]:
        """Runs best first: by the final validation value of their objective_metric (where it is one of
        `metrics`), else of accuracy, else by the validation loss, else the training loss; failed, cancelled and
        unfinished runs last (nbscale.training.run_table.rank_key)."""
        return ranked(self.runs)

    def cancel(self, index: int | None = None) -> None:
        """Cancel run `index` (queued or running; its worker takes the next run), or every run not yet ended."""
        for run in self.runs if index is None else [self.runs[index]]:
            run.cancel()

    def wait(self, timeout: float | None = None) -> SweepResult:
        """Block until every run ended (or `timeout` seconds); the kernel interrupt cancels the runs still going."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                pending = [run for run in self.runs if not run.done()]
                wait_for_futures(
                    pending, timeout=min(0.25, left) if left is not None else 0.25, return_when=FIRST_COMPLETED
                )
        except KeyboardInterrupt:
            self.cancel()
            wait_for_futures(self.runs, timeout=10)
        if self.done:
            for callback in self.on_end:
                callback()
        return self

    def table(self) -> RunsTable:
        """The results table, best first (HTML in notebooks, text elsewhere)."""
        return RunsTable("Results (best first)", tuple(self.ranked()))

    def to_dataframe(self) -> Any:
        """The results table as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.table().rows())


def sweep(
    make_model: Callable[[], nn.Module] | nn.Module,
    train_data: object,
    options: TrainingOptions | None = None,
    grid: dict[str, Sequence[Any]] | None = None,
    pool: object = None,
    loss_fn: Callable[..., Any] | str | None = None,
    val_data: object = None,
    wait: bool = True,
    seed: int | None = None,
    *,
    step_fn: Callable[..., Any] | None = None,
) -> SweepResult:
    """Train one network per combination of `grid` (option name -> list of values), each on its own worker.

    `make_model()` builds a fresh network per run (or pass a network: each run starts from a copy of it).
    `loss_fn`, `step_fn` and `val_data` are nbscale.train's, the same for every run. `pool` defaults to the current
    pool (one is started if none runs). Every combination is checked before any
    run starts (OptionsError). `wait=False` returns at once; `result.wait()` blocks later. Shows nothing: the
    live figure is nbscale.sweep's (nbscale.notebook). Returns a SweepResult holding every run's net and info;
    failed runs keep their error (`run.error`).

    `seed` (an int) makes the sweep reproducible: every run starts as `torch.manual_seed(seed); net =
    make_model()` and draws its data order, augmentation and dropout as `nbscale.train(net, ...)` does next, so
    all runs start from the same weights, the same seed gives the same results, and run k is reproduced by
    `torch.manual_seed(seed); nbscale.train(make_model(), train_data, result[k].options)` on the same kind of
    device. None: every run draws its own.
    """
    from nbscale.pool.pool import current_pool
    from nbscale.training.trainer import checked_inputs

    base = as_options(options)
    if val_data is not None:
        base = base.replace(validation_data=val_data)
    combinations = grid_combinations(grid)
    run_options = _own_checkpoint_folders([base.replace(**params) for params in combinations])  # all checked first
    _check_seed(seed)
    seeded = (
        [seeded_model(make_model, seed) for _ in combinations]
        if seed is not None
        else [(fresh_model(make_model), None) for _ in combinations]
    )
    # every run checked as nbscale.train checks it (a DataLoader's batch_size against the run's mini_batch_size
    # too), before a pool starts and before any run is sent
    checked = [
        checked_inputs(model, train_data, opts, loss_fn, step_fn, one_worker=True)
        for (model, _), opts in zip(seeded, run_options, strict=True)
    ]
    pool = pool if pool is not None else current_pool(start=True)
    result = SweepResult(_submit_every_run(seeded, checked, combinations, pool), pool)
    if wait:
        result.wait()
    return result


def _submit_every_run(
    seeded: list[tuple[nn.Module, Any]], checked: list[Any], combinations: list[dict[str, Any]], pool: Any
) -> list[TrainingRun]:
    """Send each run to the pool; an interrupt (or a run that cannot be sent) cancels those already sent: none of
    them goes on alone, unseen."""
    runs: list[TrainingRun] = []
    try:
        for index, ((model, start), inputs, params) in enumerate(zip(seeded, checked, combinations, strict=True)):
            runs.append(submit_run(model, inputs, pool, name=f"#{index + 1}", params=params, seeded=start))
    except BaseException:
        for run in runs:
            run.cancel()
        raise
    return runs


def _check_seed(seed: object) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise OptionsError(
            f"seed={seed!r} must be a whole number from 0 to 2**63 - 1 (as torch.manual_seed takes), "
            "or None for a different start in every run."
        )


def _own_checkpoint_folders(run_options: list[TrainingOptions]) -> list[TrainingOptions]:
    """Runs that would write checkpoints into one folder each write into their own subfolder, `run-K` for run #K:
    their files have the same names (nbscale_checkpoint_epochNNNN.pt), so each run would overwrite the others' and
    resume_from would continue another run. `result[k].options.checkpoint_path` is run k's folder."""
    paths = [str(opts.checkpoint_path) for opts in run_options if opts.checkpoint_path is not None]
    shared = {path for path in paths if paths.count(path) > 1}
    return [
        opts.replace(checkpoint_path=os.path.join(opts.checkpoint_path, f"run-{index + 1}"))
        if opts.checkpoint_path is not None and str(opts.checkpoint_path) in shared
        else opts
        for index, opts in enumerate(run_options)
    ]


def parse_grid(specs: Sequence[str]) -> dict[str, Sequence[Any]]:
    """A grid from `%%train --sweep` texts: ["initial_learn_rate=0.01,0.1", "solver=sgdm,adam"]."""
    import ast

    grid: dict[str, Sequence[Any]] = {}
    for spec in specs:
        name, equals, values = spec.strip().strip("\"'").partition("=")  # IPython keeps the quotes
        name = name.strip()
        if not equals or not name or not values.strip():
            raise OptionsError(
                f'--sweep {spec!r}: write FIELD=VALUE1,VALUE2 (e.g. --sweep "initial_learn_rate=0.01,0.1").'
            )
        parsed = []
        for text in values.split(","):
            text = text.strip()
            try:
                parsed.append(float("inf") if text == "inf" else ast.literal_eval(text))
            except (ValueError, SyntaxError):
                parsed.append(text)  # words: solver names, shuffle modes, ...
        if name in grid:
            raise OptionsError(f"--sweep names {name} twice: give all its values in one --sweep.")
        grid[name] = parsed
    return grid
