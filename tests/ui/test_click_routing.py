"""Widget clicks reach the kernel while a cell runs (a subshell takes the comm's messages), in a real kernel.

The routing leans on ipykernel's private `comm._reply_subshell_id` (ipykernel >= 7.4): these tests fail, in
seconds, when an ipykernel release changes it, instead of a Stop button that silently waits for the cell's end.
"""

from __future__ import annotations

import pytest

from tests.kernel_session import handles_clicks_mid_cell, needs_clicks_mid_cell
from tests.training.widget_click import run_and_click

pytestmark = pytest.mark.slow

WAIT_FOR_A_CLICK = """
import time
import ipywidgets
from IPython.display import display
from nbscale.ui.click_routing import route_clicks_off_main_thread

clicks = []
button = ipywidgets.Button(description="Click me")
button.on_click(lambda _: clicks.append(time.monotonic()))
display(button)
undo = route_clicks_off_main_thread(button)
deadline = time.monotonic() + 20
while not clicks and time.monotonic() < deadline:  # the cell holds the main thread, as training does
    time.sleep(0.02)
print("routed" if undo is not None else "not routed", "clicked" if clicks else "not clicked")
undo and undo()
"""


@needs_clicks_mid_cell
def test_a_click_is_handled_while_the_cell_still_runs(kernel) -> None:
    result = run_and_click(kernel, WAIT_FOR_A_CLICK, click_after=0.5, timeout=60)
    assert result.ok, result.text
    assert result.stdout.split() == ["routed", "clicked"]


@needs_clicks_mid_cell
def test_the_subshell_exists_while_routed_and_is_deleted_after(kernel) -> None:
    result = kernel.run("""
import ipywidgets
from IPython.display import display
from nbscale.ui.click_routing import route_clicks_off_main_thread

kernel = get_ipython().kernel
button = ipywidgets.Button()
display(button)
undo = route_clicks_off_main_thread(button)
route = button.comm._reply_subshell_for(None, None)  # where ipykernel sends the comm's incoming messages
print(route is not None and route in kernel.shell_channel_thread.manager.list_subshell())
undo()
print(kernel.shell_channel_thread.manager.list_subshell())
""")
    assert result.ok, result.text
    assert result.stdout.splitlines() == ["True", "[]"]


def test_outside_a_kernel_nothing_is_routed_and_the_stop_button_says_to_interrupt() -> None:
    import ipywidgets

    from nbscale.training.events import StopSignal
    from nbscale.ui.click_routing import route_clicks_off_main_thread
    from nbscale.ui.stop_button import say_stop_needs_the_interrupt, stop_button

    button = stop_button(StopSignal())
    assert route_clicks_off_main_thread(button) is None
    say_stop_needs_the_interrupt(button)
    assert isinstance(button, ipywidgets.Button) and button.disabled and "interrupt" in button.description


@needs_clicks_mid_cell
def test_a_training_that_fails_removes_its_stop_button_and_subshell(kernel) -> None:
    assert kernel.run("""
import nbscale, torch
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
calls = []
def failing_loss(outputs, labels):  # breaks at the third iteration: a first one that fails is checked (ModelError)
    calls.append(1)
    if len(calls) == 3:
        raise RuntimeError("the loss broke")
    return torch.nn.functional.cross_entropy(outputs, labels)
""").ok
    failed = kernel.run("""
nbscale.train(tiny_net(), (train_x, train_y), nbscale.TrainingOptions("sgdm", max_epochs=1, verbose=False,
              plots="training-progress"), loss_fn=failing_loss)
""")
    assert failed.error_value == "the loss broke"
    assert {"text/plain": ""} in failed.displays  # the button was replaced by nothing
    left = kernel.run("print(get_ipython().kernel.shell_channel_thread.manager.list_subshell())")
    assert left.stdout.strip() == "[]", left.text


def test_the_stop_button_a_kernel_shows_is_the_one_its_ipykernel_can_run(kernel, tmp_path) -> None:
    """ipykernel >= 7.4 shows a live "Stop" (its clicks routed to a subshell); an older one (the floor, 6.29) the
    documented fallback, a disabled "Stop: interrupt the kernel" (docs/troubleshooting.md). On both the kernel
    interrupt stops the run at the end of its iteration and keeps the network."""
    training = tmp_path / "training"
    assert kernel.run(f"""
import pathlib
import nbscale
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
training = pathlib.Path({str(training)!r})
def started(info):
    training.touch()
    return False
""").ok
    result = kernel.run(
        """
net, info = nbscale.train(tiny_net(), (train_x, train_y), nbscale.TrainingOptions("sgdm", max_epochs=5000,
                          verbose=False, plots="training-progress", output_fn=started))
print(info.stop_reason, type(net).__name__)
""",
        timeout=120,
        interrupt_when=training.exists,
    )
    assert result.ok, result.text
    assert result.stdout.split()[-5:] == ["Stopped", "by", "kernel", "interrupt", "Sequential"], result.text
    descriptions = [state["description"] for state in result.widget_states if "description" in state]
    assert "Stop" in descriptions, descriptions
    fallback = "Stop: interrupt the kernel"
    if handles_clicks_mid_cell():
        assert fallback not in descriptions, descriptions
    else:
        assert fallback in descriptions, descriptions
