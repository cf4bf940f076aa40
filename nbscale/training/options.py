"""`TrainingOptions`: MATLAB's trainingOptions as one validated dataclass.

Every field is MATLAB's option name in snake_case with MATLAB's default where MATLAB has one. All checks
live in option_checks.py's `_CHECKS` and `TrainingOptions.validate`; a wrong name or value raises `OptionsError`
naming the field and its allowed values (a misspelt name suggests the right one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from nbscale.errors import OptionsError
from nbscale.training.option_checks import _CHECKS as _CHECKS
from nbscale.training.option_checks import _loggers as _loggers
from nbscale.training.option_checks import check_field as check_field
from nbscale.training.option_checks import short_value
from nbscale.training.option_names import options_from_pairs, unknown_field_message
from nbscale.training.option_values import SOLVER_DEFAULTS as SOLVER_DEFAULTS
from nbscale.training.option_values import AutoBatch as AutoBatch
from nbscale.training.option_values import CompileMode as CompileMode
from nbscale.training.option_values import DataPlacement as DataPlacement
from nbscale.training.option_values import Environment as Environment
from nbscale.training.option_values import LearnRateScaling as LearnRateScaling
from nbscale.training.option_values import ObjectiveGoal as ObjectiveGoal
from nbscale.training.option_values import OutputNetwork as OutputNetwork
from nbscale.training.option_values import Plots as Plots
from nbscale.training.option_values import Precision as Precision
from nbscale.training.option_values import Schedule as Schedule
from nbscale.training.option_values import ScheduleStep as ScheduleStep
from nbscale.training.option_values import ShuffleMode as ShuffleMode
from nbscale.training.option_values import Solver as Solver
from nbscale.training.option_values import ThresholdMethod as ThresholdMethod
from nbscale.training.option_values import WorkerFailure as WorkerFailure


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
        lines = [f"TrainingOptions({short_value(shown_choice(self.solver))},"]
        for name in field_names():
            if name != "solver":
                value = getattr(self, name)
                lines.append(f"    {name}={short_value(shown_choice(value) if name in FACTORY_FIELDS else value)},")
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


def as_options(options: object) -> TrainingOptions:
    """`options` as TrainingOptions: the defaults for None, an options form's own; OptionsError otherwise."""
    if options is None:
        return TrainingOptions("sgdm")
    unwrapped = unwrap_form(options)
    if isinstance(unwrapped, TrainingOptions):
        return unwrapped
    raise OptionsError(
        f"options must be a TrainingOptions (nbscale.TrainingOptions('sgdm', ...)), not {type(options).__name__}."
    )


# the fields that take a name or the user's own factory (a callable solver or learn-rate schedule)
FACTORY_FIELDS = ("solver", "learn_rate_schedule")


def shown_choice(value: object) -> Any:
    """`value` as shown to the user (repr, options form, %%train): "custom" for a factory, else itself."""
    return "custom" if callable(value) and not isinstance(value, str) else value


def _objective_fits(options: TrainingOptions) -> None:
    """OptionsError when objective_metric is not among the metrics or objective_goal contradicts it. With
    metrics=None the default is "accuracy", or "rmse" under a regression, which the data may yet decide."""
    from nbscale.training.losses import is_regression_loss
    from nbscale.training.run_metrics import objective, resolve_metrics

    regression = is_regression_loss(options.loss)
    if options.metrics is None and not regression and options.objective_metric == "rmse":
        regression = True  # float targets make "rmse" the default: known on the first batch
    objective(options.objective_metric, options.objective_goal, resolve_metrics(options.metrics, regression=regression))
