"""`TrainingOptions`: MATLAB's trainingOptions as one validated dataclass.

Every field is MATLAB's option name in snake_case with MATLAB's default where MATLAB has one. All checks
live in `_CHECKS` and `TrainingOptions.validate`; a wrong name or value raises `OptionsError` naming the
field and its allowed values (a misspelt name suggests the right one).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from nbscale.errors import OptionsError
from nbscale.training.option_names import options_from_pairs, unknown_field_message

Solver = Literal["sgdm", "adam", "adamw", "rmsprop"]
ShuffleMode = Literal["once", "never", "every-epoch"]
Schedule = Literal["none", "piecewise", "cosine", "warmup-cosine"]
ThresholdMethod = Literal["l2norm", "global-l2norm", "absolute-value"]
OutputNetwork = Literal["last-iteration", "best-validation"]
Environment = Literal["auto", "cpu", "gpu", "multi-gpu", "parallel"]
Precision = Literal["single", "mixed"]
Plots = Literal["training-progress", "none"]
DataPlacement = Literal["auto", "stream", "device"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
WorkerFailure = Literal["error", "restart"]
LearnRateScaling = Literal["none", "linear"]
AutoBatch = Literal["auto"]
ScheduleStep = Literal["iteration", "epoch"]
ObjectiveGoal = Literal["auto", "minimize", "maximize"]

SOLVERS: tuple[str, ...] = get_args(Solver)
SHUFFLE_MODES: tuple[str, ...] = get_args(ShuffleMode)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
THRESHOLD_METHODS: tuple[str, ...] = get_args(ThresholdMethod)
OUTPUT_NETWORKS: tuple[str, ...] = get_args(OutputNetwork)
ENVIRONMENTS: tuple[str, ...] = get_args(Environment)
PRECISIONS: tuple[str, ...] = get_args(Precision)
PLOTS: tuple[str, ...] = get_args(Plots)
DATA_PLACEMENTS: tuple[str, ...] = get_args(DataPlacement)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
WORKER_FAILURES: tuple[str, ...] = get_args(WorkerFailure)
LEARN_RATE_SCALINGS: tuple[str, ...] = get_args(LearnRateScaling)
SCHEDULE_STEPS: tuple[str, ...] = get_args(ScheduleStep)
OBJECTIVE_GOALS: tuple[str, ...] = get_args(ObjectiveGoal)
MAX_EPOCHS_LIMIT = 1_000_000  # more is a typo (1e23), not a plan: it would train until interrupted

# MATLAB's solver-dependent defaults: each field's default by solver
SOLVER_DEFAULTS: dict[str, dict[str, float]] = {
    "initial_learn_rate": {"sgdm": 0.01, "adam": 0.001, "adamw": 0.001, "rmsprop": 0.001},
    "squared_gradient_decay_factor": {"sgdm": 0.999, "adam": 0.999, "adamw": 0.999, "rmsprop": 0.9},
}


def _defaults_key(solver: object) -> str:
    """The SOLVER_DEFAULTS column of `solver`: a callable solver (the user's factory) takes the generic
    defaults, Adam's (initial_learn_rate 0.001)."""
    return solver if isinstance(solver, str) else "adam"


# the default of those fields: None, which construction and assignment replace by the solver's float
_SOLVER_DEFAULT: Any = None


@dataclass(init=False, repr=False, eq=False)
class TrainingOptions:
    """Training options (trainingOptions): `TrainingOptions("adam", max_epochs=10, mini_batch_size=64)`, or
    with MATLAB's name-value pairs: `TrainingOptions("adam", "MaxEpochs", 10, "MiniBatchSize", 64)`.

    Raises OptionsError (a ValueError) for an unknown field or a value outside the allowed ones.
    Setting a field afterwards (`opts.max_epochs = 5`) is checked the same way; `opts.replace(**fields)`
    returns a changed copy.
    """

    solver: Solver = "sgdm"
    initial_learn_rate: float = _SOLVER_DEFAULT  # None: 0.01 for sgdm, 0.001 otherwise (MATLAB's defaults)
    momentum: float = 0.9
    gradient_decay_factor: float = 0.9
    squared_gradient_decay_factor: float = _SOLVER_DEFAULT  # None: 0.9 for rmsprop, 0.999 otherwise
    epsilon: float = 1e-8
    l2_regularization: float = 1e-4
    gradient_threshold: float = math.inf
    gradient_threshold_method: ThresholdMethod = "l2norm"
    max_epochs: int = 30
    mini_batch_size: int | AutoBatch = 128  # "auto": fitted to the GPUs' memory (nbscale.training.batch_fitting)
    shuffle: ShuffleMode = "once"
    learn_rate_schedule: Schedule = "none"
    learn_rate_drop_factor: float = 0.1
    learn_rate_drop_period: int = 10
    validation_data: Any = None
    validation_frequency: int = 50
    validation_patience: float = math.inf
    output_network: OutputNetwork = "last-iteration"
    execution_environment: Environment = "auto"
    worker_load: Sequence[float] | None = None
    dispatch_in_background: bool = False
    precision: Precision = "single"
    plots: Plots = "none"
    verbose: bool = True
    verbose_frequency: int = 50
    checkpoint_path: str | None = None
    checkpoint_frequency: int = 1
    output_fn: Callable[[Any], Any] | None = None
    data_placement: DataPlacement = "auto"
    compile: bool | CompileMode = False
    on_worker_failure: WorkerFailure = "error"
    learn_rate_scaling: LearnRateScaling = "none"
    learn_rate_reference_batch: int = 128  # "linear": initial_learn_rate is the rate for a global mini-batch of this
    # a callable learn_rate_schedule is stepped every "iteration" or every "epoch" (ReduceLROnPlateau: each validation)
    learn_rate_schedule_step: ScheduleStep = "iteration"
    loss: Any = (
        None  # None: cross-entropy for class labels; a name (nbscale.training.losses) or (outputs, targets) -> loss
    )
    metrics: Any = None  # None: ("accuracy",) for class labels, ("rmse",) under a regression loss; else a sequence
    objective_metric: str = "loss"  # MATLAB's ObjectiveMetricName: "loss" (validation loss) or one of `metrics`
    objective_goal: ObjectiveGoal = "auto"  # "auto": known for the named metrics; "minimize"/"maximize" otherwise
    loggers: Sequence[Any] = ()  # objects with log(metrics: dict, step: int) and close() (nbscale.loggers)
    _ready: bool = field(default=False, compare=False, init=False)  # not an argument: dataclasses.replace works

    def __init__(self, solver: Solver = "sgdm", *pairs: object, **options: object) -> None:
        names = field_names()
        if pairs:  # MATLAB's name-value pairs: ("InitialLearnRate", 0.01)
            from_pairs = options_from_pairs(solver, pairs, names)
            if twice := sorted(from_pairs.keys() & options.keys()):
                raise OptionsError(f"TrainingOptions got {twice[0]} both as a name-value pair and as a keyword.")
            options = {**from_pairs, **options}
        for name in options:
            if name not in names:
                raise OptionsError(unknown_field_message(name, names))
        object.__setattr__(self, "_ready", False)
        # told of each accepted change made from code; not a dataclass field, so out of eq, repr, pickle, asdict
        self._observer: Callable[[TrainingOptions], None] | None
        object.__setattr__(self, "_observer", None)
        for f in fields(self):
            if f.name not in ("_ready",):
                object.__setattr__(self, f.name, f.default)
        object.__setattr__(self, "solver", check_field("solver", solver))
        for name, value in options.items():
            object.__setattr__(self, name, value)
        for name, defaults in SOLVER_DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, defaults[_defaults_key(self.solver)])
        self.validate()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        """Checked like the constructor: None gives a solver-dependent field its solver's default, and a new
        solver brings its defaults to the fields that held the old one's (as `replace(solver=...)` does)."""
        if name not in field_names():
            raise OptionsError(unknown_field_message(name, field_names()))
        changes = {name: value}
        if name == "solver":
            changes.update(self._defaults_of(value))
        elif name in SOLVER_DEFAULTS and value is None:
            changes[name] = SOLVER_DEFAULTS[name][_defaults_key(self.solver)]
        previous = {changed: getattr(self, changed) for changed in changes}
        try:
            for changed, new in changes.items():
                object.__setattr__(self, changed, check_field(changed, new))
            self.validate()
        except OptionsError:
            for changed, old in previous.items():  # a refused change leaves the options as they were
                object.__setattr__(self, changed, old)
            raise
        if self._observer is not None:
            self._observer(self)

    def observe(self, observer: Callable[[TrainingOptions], None] | None) -> None:
        """Call `observer(self)` after each accepted change of a field (None: no more); the options form these
        came from uses it to show a change made from code. Copies and pickles do not keep it."""
        object.__setattr__(self, "_observer", observer)

    def validate(self) -> None:
        """Check every field and the combinations; raises OptionsError."""
        for name in field_names():
            object.__setattr__(self, name, check_field(name, getattr(self, name)))
        if self.output_network == "best-validation" and self.validation_data is None:
            raise OptionsError(
                "output_network='best-validation' needs validation_data: pass validation_data=... "
                "or use output_network='last-iteration'."
            )
        _objective_fits(self)

    def replace(self, **changes: Any) -> TrainingOptions:
        """A copy with `changes` applied (checked like the constructor)."""
        values = {name: getattr(self, name) for name in field_names() if name != "solver"}
        solver = changes.pop("solver", self.solver)
        values.update(self._defaults_of(solver))
        values.update(changes)
        return TrainingOptions(solver, **values)

    def _defaults_of(self, solver: str) -> dict[str, Any]:
        """The solver-dependent fields that hold the current solver's default, at `solver`'s default instead
        (a value the user set stays)."""
        solver = check_field("solver", solver)
        return {
            name: defaults[_defaults_key(solver)]
            for name, defaults in SOLVER_DEFAULTS.items()
            if getattr(self, name) == defaults[_defaults_key(self.solver)]
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (solver included)."""
        return {name: getattr(self, name) for name in field_names()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrainingOptions) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        lines = [f"TrainingOptions({_short(shown_choice(self.solver))},"]
        for name in field_names():
            if name != "solver":
                value = getattr(self, name)
                lines.append(f"    {name}={_short(shown_choice(value) if name in FACTORY_FIELDS else value)},")
        return "\n".join(lines) + "\n)"

    def __getstate__(self) -> dict[str, Any]:
        return self.to_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_observer", None)
        object.__setattr__(self, "_ready", True)


def field_names() -> tuple[str, ...]:
    """The option names, in declaration order (solver first)."""
    return tuple(f.name for f in fields(TrainingOptions) if not f.name.startswith("_"))


def unwrap_form(value: object) -> object:
    """The TrainingOptions an options form carries (its `.options`, which raises OptionsError while a value in
    the form is wrong), or `value` itself when it is no form."""
    carried = getattr(value, "options", None)
    return carried if isinstance(carried, TrainingOptions) else value


# the fields that take a name or the user's own factory (a callable solver or learn-rate schedule)
FACTORY_FIELDS = ("solver", "learn_rate_schedule")


def shown_choice(value: object) -> Any:
    """`value` as shown to the user (repr, options form, %%train): "custom" for a factory, else itself."""
    return "custom" if callable(value) and not isinstance(value, str) else value


def _short(value: object) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, numbers.Number) and hasattr(value, "item"):  # a numpy scalar
        return repr(value.item())
    if callable(value):
        return f"<function {getattr(value, '__name__', type(value).__name__)}>"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return repr(list(value))
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ")"
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
    """None, a sequence of metrics, or one alone; the names and types in it are checked by nbscale.training.metrics,
    whose OptionsError names the metric and the fix (what depends on the data is checked on the first batch)."""
    if value is not None and not callable(value) and (not isinstance(value, Sequence) or isinstance(value, bytes)):
        return "None or a sequence of metrics, e.g. ('accuracy', 'fscore')"
    from nbscale.training.metrics import resolve_metrics

    resolve_metrics(value, regression=False)
    return None


def _objective_metric(value: object) -> str | None:
    return None if isinstance(value, str) and value else "'loss' or the name of one of the metrics"


def _objective_fits(options: TrainingOptions) -> None:
    """OptionsError when objective_metric is not among the metrics or objective_goal contradicts it. With
    metrics=None the default is "accuracy", or "rmse" under a regression, which the data may yet decide."""
    from nbscale.training.losses import is_regression_loss
    from nbscale.training.metrics import objective, resolve_metrics

    regression = is_regression_loss(options.loss)
    if options.metrics is None and not regression and options.objective_metric == "rmse":
        regression = True  # float targets make "rmse" the default: known on the first batch
    objective(options.objective_metric, options.objective_goal, resolve_metrics(options.metrics, regression=regression))


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
        raise OptionsError(f"TrainingOptions.{name}={_short(given)} is not allowed: {name} must be {allowed}.")
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
