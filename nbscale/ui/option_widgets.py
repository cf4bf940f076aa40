"""One ipywidget per TrainingOptions field, and how its value converts to and from the option's value.

The options form (nbscale.ui.options_form) lays these out and validates them; this module only knows which
kind of widget shows each field: dropdowns for choices, number boxes (never clamped: a value out of range is
shown wrong, not changed), text boxes for fields that take a number or a word ("inf", "auto"), the notebook's
own variables for validation_data and output_fn, and one slider per pool worker for worker_load.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

from nbscale.training import option_values as rules

CHOICES = {
    "solver": rules.SOLVERS,
    "gradient_threshold_method": rules.THRESHOLD_METHODS,
    "shuffle": rules.SHUFFLE_MODES,
    "learn_rate_schedule": rules.SCHEDULES,
    "output_network": rules.OUTPUT_NETWORKS,
    "precision": rules.PRECISIONS,
    "plots": rules.PLOTS,
    "data_placement": rules.DATA_PLACEMENTS,
    "on_worker_failure": rules.WORKER_FAILURES,
    "learn_rate_scaling": rules.LEARN_RATE_SCALINGS,
    "learn_rate_schedule_step": rules.SCHEDULE_STEPS,
    "objective_goal": rules.OBJECTIVE_GOALS,
}
# compile: off, on (torch.compile's default mode), or a named mode
COMPILE_CHOICES = [("off", False), ("on", True), *((f"mode {mode!r}", mode) for mode in rules.COMPILE_MODES)]
INTEGERS = (
    "max_epochs",
    "learn_rate_drop_period",
    "validation_frequency",
    "verbose_frequency",
    "checkpoint_frequency",
    "learn_rate_reference_batch",
)  # all >= 1
FRACTIONS = ("momentum", "learn_rate_drop_factor")  # in [0, 1], stepped by 0.05
FLOATS = (
    "initial_learn_rate",
    "gradient_decay_factor",
    "squared_gradient_decay_factor",
    "epsilon",
    "l2_regularization",
)  # open bounds: checked by the rules, shown inline
NUMBER_OR_INF = ("gradient_threshold", "validation_patience")
FLAGS = ("dispatch_in_background", "verbose")
NOTEBOOK_OBJECTS = (
    "validation_data",
    "output_fn",
    "loss",
    "metrics",
    "loggers",
)  # chosen among the notebook's variables
TEXT_FIELDS = (
    *NUMBER_OR_INF,
    "mini_batch_size",
    "checkpoint_path",
    "objective_metric",
)  # shown and read through text_of / value_of
NONE = "None"
KEPT = "(value given in options)"  # a validation_data / output_fn object no notebook variable holds
# the text boxes' hints, by field
_PLACEHOLDERS = {
    **dict.fromkeys(NUMBER_OR_INF, "a number, or inf"),
    "mini_batch_size": "a whole number, or auto (GPUs)",
    "checkpoint_path": "a folder; empty: no checkpoints",
    "objective_metric": "loss, or one of the metrics",
}

_LABEL_STYLE = {"description_width": "230px"}
_WIDTH = "420px"


def make_widget(name: str, notebook_names: Callable[[Callable[[Any], bool]], list[str]]) -> Any:
    """The widget for TrainingOptions field `name`; `notebook_names(accept)` lists the notebook variables whose
    values `accept` takes (the choices for validation_data and output_fn). A new field needs a case here."""
    import ipywidgets as w

    common = {"description": name, "style": _LABEL_STYLE, "layout": w.Layout(width=_WIDTH)}
    dropdown = _dropdown_options(name)
    if dropdown is not None:
        return w.Dropdown(options=dropdown, **common)
    if name in _NOTEBOOK_CHOICES:
        return w.Dropdown(options=[NONE, *notebook_names(_NOTEBOOK_CHOICES[name])], **common)
    if name in _PLACEHOLDERS:
        return w.Text(placeholder=_PLACEHOLDERS[name], **common)
    if name in INTEGERS:
        return w.IntText(**common)
    if name in FRACTIONS:
        return w.FloatText(step=0.05, **common)
    if name in FLOATS:
        return w.FloatText(**common)
    if name in FLAGS:
        return w.Checkbox(indent=False, **{k: v for k, v in common.items() if k != "layout"})
    if name == "worker_load":
        return WorkerLoad()
    raise AssertionError(f"no widget for TrainingOptions.{name}")


def _dropdown_options(name: str) -> list[Any] | None:
    """The choices of field `name` when a dropdown of fixed choices shows it, else None."""
    if name in CHOICES:
        return list(CHOICES[name])
    if name == "execution_environment":
        return hardware_choices()
    if name == "compile":
        return COMPILE_CHOICES
    return None


def text_of(name: str, value: object) -> str:
    """What the text box of field `name` shows for the option value `value`."""
    if name in NUMBER_OR_INF:
        return "inf" if value == math.inf else _format_number(value)
    if name == "checkpoint_path":
        return "" if value is None else str(value)
    return str(value)  # mini_batch_size: a number or "auto"


def value_of(name: str, text: str) -> Any:
    """The option value the text box of field `name` holds: None where the text is no value of the field (the
    form shows it as wrong)."""
    if name in NUMBER_OR_INF:
        return parse_number(text)
    if name == "mini_batch_size":  # a whole number or "auto"
        text = text.strip().lower()
        return text if text == "auto" else parse_number(text) if text else None
    if name == "objective_metric":
        return text.strip() or "loss"
    return text.strip() or None  # checkpoint_path: empty for none


class WorkerLoad:
    """One slider per worker of the current pool: the share of every mini-batch it takes (worker_load).

    Acts as one widget to the form (`value`, `disabled`, `observe`); `box` is what is shown. A worker_load whose
    length does not match the running pool is kept as given until a slider moves.
    """

    def __init__(self) -> None:
        import ipywidgets as w

        from nbscale.pool.pool import current_pool

        pool = current_pool()
        self.sliders = [
            w.FloatSlider(
                value=1.0,
                min=0.0,
                max=1.0,
                step=0.05,
                description=f"worker {rank} ({device})",
                style=_LABEL_STYLE,
                layout=w.Layout(width=_WIDTH),
            )
            for rank, device in enumerate(pool.devices if pool is not None else [])
        ]
        self.note = (
            "<i>Equal sliders: an even split (worker_load=None). 0 leaves a worker out.</i>"
            if pool
            else "<i>worker_load: start a pool (%pool start) to weigh each worker; without one, the "
            "mini-batch is split evenly.</i>"
        )
        self.box = w.VBox([w.Label("worker_load"), *self.sliders] if self.sliders else [])
        self._explicit: Any = None

    @property
    def value(self) -> Any:
        if self._explicit is not None:
            return self._explicit
        loads = [round(s.value, 4) for s in self.sliders]
        return None if not loads or (len(set(loads)) == 1 and loads[0] > 0) else loads

    @value.setter
    def value(self, loads: Any) -> None:
        if loads is not None and len(list(loads)) != len(self.sliders):
            self._explicit = loads
            return
        self._explicit = None
        loads = [1.0] * len(self.sliders) if loads is None else [float(load) for load in loads]
        scale = max(loads) if loads and max(loads) > 1 else 1.0  # sliders run 0..1; weights are relative
        for slider, load in zip(self.sliders, loads, strict=True):
            slider.value = load / scale

    @property
    def disabled(self) -> bool:
        return all(s.disabled for s in self.sliders)

    @disabled.setter
    def disabled(self, value: bool) -> None:
        for slider in self.sliders:
            slider.disabled = value

    def observe(self, handler: Callable[[dict[str, Any]], None], names: str = "value") -> None:
        def forget_explicit(change: dict[str, Any]) -> None:
            self._explicit = None
            handler(change)

        for slider in self.sliders:
            slider.observe(forget_explicit, names=names)


def hardware_choices() -> list[tuple[str, str]]:
    """The execution environments this machine and the running pool offer, as (label, value) pairs."""
    from nbscale.pool.devices import visible_gpu_ids
    from nbscale.pool.pool import current_pool

    gpus = visible_gpu_ids()  # NVML: no CUDA context is created in the notebook
    pool = current_pool()
    choices = [("auto" + (" (the GPU)" if gpus else " (the CPU: no GPU here)"), "auto"), ("cpu", "cpu")]
    if gpus:
        choices.append((f"gpu ({len(gpus)} visible)", "gpu"))
        if pool is None or pool.kind == "gpu":
            choices.append((f"multi-gpu ({pool.size if pool else len(gpus)} GPU workers)", "multi-gpu"))
    if pool is not None:
        choices.append(
            (f"parallel (the running pool: {pool.size} {pool.kind} worker{'s' if pool.size != 1 else ''})", "parallel")
        )
    else:
        choices.append(("parallel (starts a pool with default settings)", "parallel"))
    return choices


def parse_number(text: str) -> float | int | None:
    """`text` as a number (an int where whole; "inf" for infinity), None where it is none."""
    text = text.strip().lower()
    if text in ("inf", "infinity", "math.inf"):
        return math.inf
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def _format_number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def looks_like_data(value: object) -> bool:
    """True for what validation_data takes: a Dataset, or an (inputs, labels) pair of tensors."""
    from torch import Tensor
    from torch.utils.data import Dataset

    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, Tensor) for v in value):
        return True
    return isinstance(value, Dataset)


def is_sequence(value: object) -> bool:
    """True for a list or tuple (what metrics and loggers list)."""
    return isinstance(value, list | tuple)


def is_user_function(value: object) -> bool:
    """True for a function defined in the notebook (what output_fn lists)."""
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


# the fields whose dropdown lists the notebook's variables, with the test of the values each takes
_NOTEBOOK_CHOICES: dict[str, Callable[[Any], bool]] = {
    "validation_data": looks_like_data,
    "output_fn": is_user_function,
    "loss": is_user_function,
    "metrics": is_sequence,
    "loggers": is_sequence,
}
