"""The Stop button of a training display: a click asks the run to stop at the end of its iteration."""

from __future__ import annotations

from functools import cache
from typing import Any

from nbscale.training.events import StopSignal
from nbscale.ui import widget_front_end

STOP_TOOLTIP = "Stop training at the end of this iteration (the kernel interrupt does too)"


def stop_button(stop: StopSignal, tooltip: str = STOP_TOOLTIP) -> Any:
    """An ipywidgets Button that requests `stop` when clicked, then shows "Stopping..." (disabled).

    Its clicks arrive only after the running cell ends unless they are routed to a subshell
    (nbscale.ui.click_routing); where they cannot be, `say_stop_needs_the_interrupt` says so on it.
    """
    import ipywidgets

    counted = widget_front_end.ASKED.is_set()  # a view count is a comm message: only where live figures are asked
    kind = _button_class() if counted else ipywidgets.Button
    button = kind(description="Stop", icon="stop", button_style="danger", tooltip=tooltip)

    def on_click(_: object) -> None:
        stop.request("Stopped by the Stop button")
        button.disabled = True
        button.description = "Stopping..."

    button.on_click(on_click)
    if counted:  # its first view tells this kernel its front end draws widgets (a live figure)
        widget_front_end.watch(button)
    return button


@cache
def _button_class() -> Any:
    """ipywidgets' Button, its views counted by the front end (nbscale.ui.widget_front_end) with no echo: ipywidgets
    echoes an update from the thread that handles it, a subshell's, and ipykernel then sends the comm's next messages
    (a click) to the main thread's shell, which the running cell holds."""
    import ipywidgets
    import traitlets

    class StopButton(ipywidgets.Button):  # type: ignore[misc]  # ipywidgets is untyped
        _view_count = traitlets.Int(0, allow_none=True).tag(sync=True, echo_update=False)

    return StopButton


def say_stop_needs_the_interrupt(button: Any) -> None:
    """Training holds the cell to its end, so a button whose clicks wait for the cell's end cannot stop it."""
    button.disabled = True
    button.description = "Stop: interrupt the kernel"
    button.tooltip = (
        "This kernel handles clicks only after the cell (in-cell clicks need ipykernel >= 7.4 with "
        "subshells): interrupt the kernel to stop at the end of the current iteration."
    )
