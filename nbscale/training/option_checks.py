"""Each TrainingOptions field's check (`_CHECKS`, `check_field`): None when a value is fine, else the allowed
values as words for the OptionsError naming the field."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from nbscale.errors import OptionsError
from nbscale.training.option_values import (
    COMPILE_MODES,
    DATA_PLACEMENTS,
    ENVIRONMENTS,
    LEARN_RATE_SCALINGS,
    MAX_EPOCHS_LIMIT,
    OBJECTIVE_GOALS,
    OUTPUT_NETWORKS,
    PLOTS,
    PRECISIONS,
    SCHEDULE_STEPS,
    SCHEDULES,
    SHUFFLE_MODES,
    SOLVER_DEFAULTS,
    SOLVERS,
    THRESHOLD_METHODS,
    WORKER_FAILURES,
)


def short_value(value: object) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, numbers.Number) and hasattr(value, "item"):  # a numpy scalar
        return repr(value.item())
    if callable(value):
        return f"<function {getattr(value, '__name__', type(value).__name__)}>"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return repr(list(value))
    if isinstance(value, tuple):
        return "(" + ", ".join(short_value(v) for v in value) + ")"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} {tuple(value.shape)} {value.dtype}>"
    size = f" of {len(value)}" if hasattr(value, "__len__") else ""
    return f"<{type(value).__name__}{size}>"


# ---- per-field checks: each returns None when fine, or the allowed values as words ---------------------------


class _choice:  # lower case: read as the other checks' makers
    """The check of a field whose value is one of `allowed` (lower-case names, compared in lower case by
    check_field)."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = allowed

    def __call__(self, value: object) -> str | None:
        return None if value in self.allowed else "one of " + ", ".join(repr(a) for a in self.allowed)


class _choice_or_callable(_choice):
    """A choice, or the user's own factory (a callable solver or learn-rate schedule: shown as "custom")."""

    def __init__(self, allowed: Sequence[str], factory: str) -> None:
        super().__init__(allowed)
        self.factory = factory

    def __call__(self, value: object) -> str | None:
        if callable(value) and not isinstance(value, str):
            return None
        allowed = super().__call__(value)
        return None if allowed is None else f"{allowed}, or a function {self.factory}"


def _number(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_inf: bool = False,
) -> Callable[[object], str | None]:
    def check(value: Any) -> str | None:  # a numbers.Real test that mypy cannot follow through `ok`
        # numbers.Real: Python's and numpy's ints and floats alike (len(x) // 4 is often a numpy int)
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
        if ok and math.isinf(value):
            ok = allow_inf and value > 0
        elif ok:
            ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
            ok = ok and (not integer or float(value).is_integer())
        if ok:
            return None
        kind = "an integer" if integer else "a number"
        if math.isinf(high):
            kind = "a finite number" if kind == "a number" and not allow_inf else kind
            words = f"{kind} {'>' if low_open else '>='} {low}"
        else:
            words = f"{kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        return words + (" or math.inf" if allow_inf else "")

    return check


def _flag(value: object) -> str | None:
    # MATLAB writes these 1/0 ('Verbose', 0); numpy's bool_ counts too
    numpy_bool = type(value).__name__ in ("bool", "bool_") and type(value).__module__ == "numpy"
    ok = (isinstance(value, (bool, numbers.Integral)) and value in (0, 1)) or numpy_bool
    return None if ok else "True or False"


def _optional_callable(value: object) -> str | None:
    return None if value is None or callable(value) else "None or a function taking the training state"


def _optional_path(value: object) -> str | None:
    import os

    return None if value is None or isinstance(value, (str, os.PathLike)) else "None or a folder path"


def _compile(value: object) -> str | None:
    if isinstance(value, bool) or value in COMPILE_MODES:
        return None
    return "True, False, or a torch.compile mode: " + ", ".join(repr(m) for m in COMPILE_MODES)


def _dataset(value: object) -> str | None:
    from torch.utils.data import DataLoader

    if isinstance(value, DataLoader):  # what nbscale cannot follow in it is refused with the data (loader_data)
        return None
    is_array = hasattr(value, "shape") and hasattr(value, "dtype")  # inputs without labels
    odd_tuple = isinstance(value, tuple) and len(value) != 2
    if value is None or (
        hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
        and not is_array
        and not odd_tuple
        and not isinstance(value, str | bytes)
    ):
        return None
    return "None, a torch Dataset or DataLoader, or a tuple (inputs, labels) of tensors or arrays"


def _loss(value: object) -> str | None:
    """None (cross-entropy), a name of nbscale.training.losses (a misspelt one gets the closest), or a callable."""
    if value is None or callable(value):
        return None
    if not isinstance(value, str):
        return "None, a loss name such as 'crossentropy' or 'mse', or a function (outputs, targets) -> loss"
    from nbscale.training.losses import unknown_loss

    return unknown_loss(value)


def _metrics(value: object) -> str | None:
    """None, a sequence of metrics, or one alone; the names and types in it are checked by nbscale.training.run_metrics,
    whose OptionsError names the metric and the fix (what depends on the data is checked on the first batch)."""
    if value is not None and not callable(value) and (not isinstance(value, Sequence) or isinstance(value, bytes)):
        return "None or a sequence of metrics, e.g. ('accuracy', 'fscore')"
    from nbscale.training.run_metrics import resolve_metrics

    resolve_metrics(value, regression=False)
    return None


def _objective_metric(value: object) -> str | None:
    return None if isinstance(value, str) and value else "'loss' or the name of one of the metrics"


def _loggers(value: object) -> str | None:
    """Refined in nbscale.loggers; here: a sequence of objects with log(metrics, step) and close()."""
    if value is None:
        return None  # no loggers: stored as ()
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and all(callable(getattr(logger, "log", None)) and callable(getattr(logger, "close", None)) for logger in value)
    ):
        return None
    return "a list of loggers, each with log(metrics, step) and close() (e.g. nbscale.loggers.CSVLogger('run.csv'))"


def _mini_batch_size(value: object) -> str | None:
    if isinstance(value, str) and value == "auto":
        return None
    return None if _number(1, integer=True)(value) is None else "an integer >= 1, or 'auto' (fitted to GPU memory)"


def _worker_load(value: Any) -> str | None:
    allowed = "None or a list of non-negative weights, one per worker, at least one positive (e.g. [1, 2])"
    if value is None:
        return None
    if isinstance(value, str | bytes):  # '12' would read as [1, 2]
        return allowed
    try:
        weights = [float(w) for w in value]
    except (TypeError, ValueError):
        return allowed
    ok = weights and all(w >= 0 and math.isfinite(w) for w in weights) and any(w > 0 for w in weights)
    return None if ok else allowed


_CHECKS: dict[str, Callable[[object], str | None]] = {
    "solver": _choice_or_callable(SOLVERS, "params -> torch.optim.Optimizer"),
    "initial_learn_rate": _number(0, low_open=True),
    "momentum": _number(0, 1),
    "gradient_decay_factor": _number(0, 1, high_open=True),
    "squared_gradient_decay_factor": _number(0, 1, high_open=True),
    "epsilon": _number(0, low_open=True),
    "l2_regularization": _number(0),
    "gradient_threshold": _number(0, low_open=True, allow_inf=True),
    "gradient_threshold_method": _choice(THRESHOLD_METHODS),
    "max_epochs": _number(1, MAX_EPOCHS_LIMIT, integer=True),
    "mini_batch_size": _mini_batch_size,
    "shuffle": _choice(SHUFFLE_MODES),
    "learn_rate_schedule": _choice_or_callable(SCHEDULES, "optimizer -> torch.optim.lr_scheduler.LRScheduler"),
    "learn_rate_drop_factor": _number(0, 1),
    "learn_rate_drop_period": _number(1, integer=True),
    "validation_data": _dataset,
    "validation_frequency": _number(1, integer=True),
    "validation_patience": _number(1, integer=True, allow_inf=True),
    "output_network": _choice(OUTPUT_NETWORKS),
    "execution_environment": _choice(ENVIRONMENTS),
    "worker_load": _worker_load,
    "dispatch_in_background": _flag,
    "precision": _choice(PRECISIONS),
    "plots": _choice(PLOTS),
    "verbose": _flag,
    "verbose_frequency": _number(1, integer=True),
    "checkpoint_path": _optional_path,
    "checkpoint_frequency": _number(1, integer=True),
    "output_fn": _optional_callable,
    "data_placement": _choice(DATA_PLACEMENTS),
    "compile": _compile,
    "on_worker_failure": _choice(WORKER_FAILURES),
    "learn_rate_scaling": _choice(LEARN_RATE_SCALINGS),
    "learn_rate_reference_batch": _number(1, integer=True),
    "learn_rate_schedule_step": _choice(SCHEDULE_STEPS),
    "loss": _loss,
    "metrics": _metrics,
    "objective_metric": _objective_metric,
    "objective_goal": _choice(OBJECTIVE_GOALS),
    "loggers": _loggers,
}


_INTEGER_FIELDS = frozenset(
    (
        "max_epochs",
        "mini_batch_size",
        "learn_rate_drop_period",
        "validation_frequency",
        "verbose_frequency",
        "checkpoint_frequency",
        "learn_rate_reference_batch",
    )
)
_FLAG_FIELDS = frozenset(("dispatch_in_background", "verbose"))
_CHOICE_FIELDS = frozenset(name for name, check in _CHECKS.items() if isinstance(check, _choice))


def check_field(name: str, value: Any) -> Any:
    """`value` of TrainingOptions field `name` checked on its own (OptionsError naming the field and what it
    takes; the combinations are checked when TrainingOptions is built), and returned in its plain Python type
    (64.0 -> 64, numpy scalars -> int/float, 0/1 -> bool); a choice is taken in any case, as MATLAB takes its
    option values ("Adam", "GPU"), and kept in lower case."""
    if name in SOLVER_DEFAULTS and value is None:
        return value  # resolved from the solver in __init__
    given = value
    if name in _CHOICE_FIELDS and isinstance(value, str):
        value = value.lower()
    allowed = _CHECKS[name](value)
    if allowed is not None:
        raise OptionsError(f"TrainingOptions.{name}={short_value(given)} is not allowed: {name} must be {allowed}.")
    if name in _FLAG_FIELDS:
        return bool(value)
    if name == "mini_batch_size" and isinstance(value, str):  # "auto", checked above
        return value
    if name == "loggers":
        return tuple(value or ())
    if name in _INTEGER_FIELDS or (name == "validation_patience" and math.isfinite(value)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        return float(value)  # a numpy float
    return value
