"""`nbscale.options_form()`: every TrainingOptions field as a widget form, with inline validation.

The rules are TrainingOptions' own (`nbscale.training.options`): each field is checked with the same per-field
check the dataclass runs, then the whole set is built as a TrainingOptions, so the form and `train` can never
disagree. `form.options` is that TrainingOptions (OptionsError while something is wrong, so `%%train --options
form` stops before a run starts); `form.magic_line()` is the equivalent `%%train` line.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from nbscale.errors import OptionsError
from nbscale.training.options import FACTORY_FIELDS, SOLVER_DEFAULTS, TrainingOptions, check_field, field_names
from nbscale.ui.magic_line import train_magic_line
from nbscale.ui.option_widgets import (
    KEPT,
    NONE,
    NOTEBOOK_OBJECTS,
    NUMBER_OR_INF,
    TEXT_FIELDS,
    WorkerLoad,
    make_widget,
    text_of,
    value_of,
)

GROUPS: dict[str, tuple[str, ...]] = {
    "Solver": (
        "solver",
        "momentum",
        "gradient_decay_factor",
        "squared_gradient_decay_factor",
        "epsilon",
        "l2_regularization",
        "gradient_threshold",
        "gradient_threshold_method",
    ),
    "Learning rate": (
        "initial_learn_rate",
        "learn_rate_schedule",
        "learn_rate_drop_factor",
        "learn_rate_drop_period",
        "learn_rate_scaling",
        "learn_rate_reference_batch",
        "learn_rate_schedule_step",
    ),
    "Data & batches": ("max_epochs", "mini_batch_size", "shuffle", "dispatch_in_background", "data_placement"),
    "Validation": ("validation_data", "validation_frequency", "validation_patience", "output_network"),
    "Loss & metrics": ("loss", "metrics", "objective_metric", "objective_goal"),
    "Hardware": ("execution_environment", "worker_load", "precision", "compile", "on_worker_failure"),
    "Output": (
        "plots",
        "verbose",
        "verbose_frequency",
        "checkpoint_path",
        "checkpoint_frequency",
        "output_fn",
        "loggers",
    ),
}
_SCHEDULE_FIELDS = (
    "initial_learn_rate",
    "learn_rate_schedule",
    "learn_rate_drop_factor",
    "learn_rate_drop_period",
    "max_epochs",
    "learn_rate_scaling",
    "learn_rate_reference_batch",
)  # what the preview draws from


def options_form(options: TrainingOptions | None = None, bind_to: str | None = None, show: bool = True) -> OptionsForm:
    """A widget form of every training option, grouped, with inline validation (shown in a notebook; in a script,
    or with show=False, only returned).

    `options` fills the form (default: what `%%train` starts from, TrainingOptions("sgdm",
    plots="training-progress")). `bind_to` names a notebook variable that holds the form's TrainingOptions and is
    updated on every valid edit (what `%train_options NAME` does).
    `form.options` is the TrainingOptions; `%%train --options form` trains with it.
    """
    form = OptionsForm(options, bind_to=bind_to)
    if bind_to and form.valid:
        form.namespace[bind_to] = form.options
    if show and getattr(_shell(), "kernel", None) is not None:  # a script would print the widgets' long repr
        form.show()
    return form


class OptionsForm:
    """The form: `widgets` by field name, `options`, `errors`, `valid`, `magic_line()`, `set_options()`."""

    def __init__(self, options: TrainingOptions | None = None, bind_to: str | None = None) -> None:
        import ipywidgets as w

        self.bind_to = bind_to
        self.namespace = _user_namespace()
        self.errors: dict[str, str] = {}
        self._loading = False
        self._kept: dict[str, Any] = {}  # validation_data / output_fn objects not found in the notebook
        self._shown_in: int | None = None
        self.widgets: dict[str, Any] = {name: make_widget(name, self._notebook_names) for name in field_names()}
        self.messages = {name: w.HTML() for name in field_names()}
        self.summary = w.HTML()
        self.line = w.HTML()
        self.workers_note = w.HTML()
        # the learn-rate schedule drawn as the fields change (nbscale.ui.schedule_preview)
        self.schedule_image = w.Image(format="png", layout=w.Layout(width="352px"))
        self.schedule_note = w.HTML()
        self._schedule_shown: tuple[Any, ...] | None = None
        tabs = w.Tab(children=[self._group(title, names) for title, names in GROUPS.items()])
        for index, title in enumerate(GROUPS):
            tabs.set_title(index, title)
        self.widget = w.VBox([self.summary, tabs, self.line])
        # without options, what `%%train` starts from (the live plot on)
        self.set_options(options if options is not None else TrainingOptions("sgdm", plots="training-progress"))
        for name, widget in self.widgets.items():
            widget.observe(lambda change, name=name: self._changed(name, change), names="value")

    # ---- widgets -----------------------------------------------------------------------------------------------

    def _group(self, title: str, names: tuple[str, ...]) -> object:
        import ipywidgets as w

        rows = []
        for name in names:
            widget = self.widgets[name]
            shown = widget.box if isinstance(widget, WorkerLoad) else widget
            rows.append(w.HBox([shown, self.messages[name]]))
            if name == "worker_load":
                rows.append(self.workers_note)
        if title == "Learning rate":
            rows.append(w.VBox([self.schedule_image, self.schedule_note]))
        return w.VBox(rows)

    def _notebook_names(self, accept: Callable[[Any], bool]) -> list[str]:
        return sorted(name for name, value in self.namespace.items() if not name.startswith("_") and accept(value))

    # ---- values -----------------------------------------------------------------------------------------------

    def set_options(self, options: TrainingOptions) -> None:
        """Fill every widget from `options`."""
        self._loading = True
        try:
            for name in field_names():
                self._set_widget(name, getattr(options, name))
        finally:
            self._loading = False
        self._changed(None, None)

    def _set_widget(self, name: str, value: Any) -> None:
        widget = self.widgets[name]
        if name in TEXT_FIELDS:
            widget.value = text_of(name, value)
        elif name in NOTEBOOK_OBJECTS:
            widget.value = self._choice_for(name, value)
        elif name in FACTORY_FIELDS and callable(value):  # the user's factory: a "custom" entry holding it
            # pairs throughout: a mixed list reads as values; an earlier "custom" entry is replaced
            names = [
                o if isinstance(o, tuple) else (o, o)
                for o in widget.options
                if not isinstance(o, tuple) or o[0] != "custom"
            ]
            widget.options = [*names, ("custom", value)]
            widget.value = value
        elif name == "execution_environment" and value not in [v for _, v in widget.options]:
            widget.options = [*widget.options, (f"{value} (not available here)", value)]
            widget.value = value
        else:
            widget.value = value

    def _choice_for(self, name: str, value: object) -> str:
        widget = self.widgets[name]
        if value is None:
            return NONE
        found: str | None = next(
            (n for n in widget.options if n not in (NONE, KEPT) and self.namespace.get(n) is value), None
        )
        if found is not None:
            return found
        self._kept[name] = value
        if KEPT not in widget.options:
            widget.options = [*widget.options, KEPT]
        return KEPT

    def values(self) -> dict[str, Any]:
        """The widgets' values as option values (not checked)."""
        values: dict[str, Any] = {}
        for name, widget in self.widgets.items():
            value = widget.value
            if name in TEXT_FIELDS:
                value = value_of(name, value)
            elif name in NOTEBOOK_OBJECTS:
                value = None if value == NONE else self._kept.get(name) if value == KEPT else self.namespace.get(value)
            values[name] = value
        return values

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def options(self) -> TrainingOptions:
        """The TrainingOptions the form shows; OptionsError (naming each wrong field) while one is wrong.

        Setting one of its fields (`form.options.max_epochs = 5`) sets the form's widget too; `form.options = opts`
        fills the whole form.
        """
        if self.errors:
            problems = " ".join(self.errors.values())
            raise OptionsError(
                f"The options form has {len(self.errors)} wrong value(s): {problems} Fix them in "
                "the form; nothing was run."
            )
        values = self.values()
        options = TrainingOptions(values.pop("solver"), **values)
        options.observe(self._set_from_code)  # these options, changed from code, change the form
        return options

    @options.setter
    def options(self, options: TrainingOptions) -> None:
        self.set_options(options)

    def _set_from_code(self, options: TrainingOptions) -> None:
        """A field of `form.options` was set from code: show it (and keep a bound variable in step)."""
        self.set_options(options)
        if self.bind_to and self.valid:
            self.namespace[self.bind_to] = options

    def magic_line(self, name: str = "form") -> str:
        """The `%%train` line with these options: flags when they say it all, else `--options NAME`
        (nbscale.ui.magic_line); OptionsError while a value is wrong."""
        return train_magic_line(self.options, name)

    # ---- reacting to edits ----------------------------------------------------------------------------------

    def _changed(self, name: str | None, change: Any) -> None:
        if self._loading:
            return
        if name == "solver" and change is not None:
            self._solver_defaults(change["old"], change["new"])
        self.errors = _errors(self.values())
        self._show_state()
        if not self.errors and self.bind_to and name is not None:
            self.namespace[self.bind_to] = self.options

    def _solver_defaults(self, old: str, new: str) -> None:
        """A new solver brings its own learn-rate and squared-decay defaults unless they were changed (MATLAB)."""
        self._loading = True
        try:
            for field, defaults in SOLVER_DEFAULTS.items():
                if isinstance(old, str) and isinstance(new, str) and self.widgets[field].value == defaults[old]:
                    self.widgets[field].value = defaults[new]
        finally:
            self._loading = False

    def _show_state(self) -> None:
        for field, message in self.messages.items():
            text = self.errors.get(field, "")
            message.value = f"<span style='color:#d62728'>{html.escape(text)}</span>" if text else ""
        if self.errors:
            self.summary.value = (
                f"<span style='color:#d62728'>&#10007; {len(self.errors)} wrong value(s); "
                f"form.options raises until fixed.</span>"
                + "".join(
                    f"<br><span style='color:#d62728'>{html.escape(e)}</span>"
                    for f, e in self.errors.items()
                    if f == "" or f not in self.messages
                )
            )
            self.line.value = ""
        else:
            self.summary.value = "<span style='color:#2ca02c'>&#10003; Valid training options.</span>"
            name = self.bind_to or "form"
            self.line.value = f"Train with: <code>{html.escape(self.magic_line(name))}</code>"
        self._enable()
        self._preview_schedule()

    def _preview_schedule(self) -> None:
        """Redraw the schedule plot when a field it depends on changed (and says what is wrong, if one is)."""
        values = {name: self.widgets[name].value for name in _SCHEDULE_FIELDS}
        shown = tuple(values.items())
        if shown == self._schedule_shown:
            return
        self._schedule_shown = shown
        wrong = [name for name in _SCHEDULE_FIELDS if name in self.errors]
        try:
            if wrong:
                raise OptionsError(f"Fix {', '.join(wrong)} to see the learn-rate schedule.")
            if callable(values["learn_rate_schedule"]):
                raise OptionsError("A custom learn_rate_schedule (a torch scheduler) is not previewed.")
            options = TrainingOptions("sgdm", **values)
        except OptionsError as error:
            self.schedule_image.layout.display = "none"
            self.schedule_note.value = f"<i>{html.escape(str(error))}</i>"
            return
        from nbscale.ui.schedule_preview import schedule_png

        self.schedule_image.value = schedule_png(options)
        self.schedule_image.layout.display = ""
        scaled = (
            " With learn_rate_scaling='linear', training scales these rates by its global mini-batch / "
            f"{options.learn_rate_reference_batch}."
            if options.learn_rate_scaling == "linear"
            else ""
        )
        self.schedule_note.value = (
            "<i>The learn rate per epoch. The iterations per epoch depend on the data, "
            f"known when training starts, so the curve is drawn against epochs.{scaled}</i>"
        )

    def _enable(self) -> None:
        """Grey out what the other choices make irrelevant (the values stay and are still checked)."""
        get = {name: widget.value for name, widget in self.widgets.items()}
        solver = get["solver"]
        self.widgets["momentum"].disabled = solver != "sgdm"
        self.widgets["gradient_decay_factor"].disabled = solver not in ("adam", "adamw")
        self.widgets["squared_gradient_decay_factor"].disabled = solver == "sgdm"
        for field in ("learn_rate_drop_factor", "learn_rate_drop_period"):
            self.widgets[field].disabled = get["learn_rate_schedule"] != "piecewise"
        self.widgets["verbose_frequency"].disabled = not get["verbose"]
        self.widgets["checkpoint_frequency"].disabled = not get["checkpoint_path"].strip()
        on_pool = get["execution_environment"] in ("parallel", "multi-gpu")
        self.widgets["worker_load"].box.layout.display = "" if on_pool else "none"
        self.workers_note.value = self.widgets["worker_load"].note if on_pool else ""

    # ---- display ----------------------------------------------------------------------------------------------

    def show(self) -> None:
        """Display the form in the notebook."""
        from IPython.display import display

        display(self.widget)
        shell = _shell()
        self._shown_in = getattr(shell, "execution_count", None)

    def _ipython_display_(self) -> None:
        shell = _shell()
        if self._shown_in is not None and getattr(shell, "execution_count", None) == self._shown_in:
            return  # `nbscale.options_form()` as a cell's last line: shown once already
        self.show()

    def __repr__(self) -> str:
        state = "valid" if self.valid else f"{len(self.errors)} wrong value(s)"
        line = self.magic_line(self.bind_to or "form") if self.valid else ""
        return f"<OptionsForm ({state}) {line}>"


def _errors(values: dict[str, Any]) -> dict[str, str]:
    """Each wrong field's message by field name: TrainingOptions' own check of each field, then of the whole set
    (a wrong combination is filed under the first field its message names, or "")."""
    errors: dict[str, str] = {}
    for field, value in values.items():
        try:
            if field in NUMBER_OR_INF and value is None:
                raise OptionsError(f"TrainingOptions.{field}: write a number or inf.")
            if field == "mini_batch_size" and value is None:
                raise OptionsError("TrainingOptions.mini_batch_size: write a whole number, or auto.")
            check_field(field, value)
        except OptionsError as error:
            errors[field] = str(error)
    if not errors:
        try:
            values = dict(values)
            TrainingOptions(values.pop("solver"), **values)
        except OptionsError as error:
            errors[_field_named_in(str(error))] = str(error)
    return errors


def _field_named_in(message: str) -> str:
    """The field a combination error is about: the first one its message names ("" for none)."""
    places = {name: message.find(name) for name in field_names() if name in message}
    return min(places, key=lambda name: (places[name], -len(name))) if places else ""


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def _user_namespace() -> dict[str, Any]:
    shell = _shell()
    return shell.user_ns if shell is not None else {}
