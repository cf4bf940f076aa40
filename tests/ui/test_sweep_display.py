"""%%train --sweep and nbscale.show(run) in a real kernel on a CPU pool of 2: the live figure, the table,
the Cancel buttons, and a notebook that stays free while a run trains."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SETUP = """
import time, torch, nbscale
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
%pool start 2 --cpu
"""


def test_train_magic_sweeps_a_2x2_grid_with_one_figure_and_a_results_table(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = kernel.run(
        """%%train --sweep "initial_learn_rate=0.05,0.2" --sweep "mini_batch_size=64,128" --epochs 1
def make_model():
    return tiny_net()
train_data = (train_x, train_y)
val_data = val
""",
        timeout=180,
    )
    assert result.ok, result.text
    assert any(WIDGET_VIEW in d for d in result.displays)  # the Cancel buttons while it ran
    assert any("image/png" in d for d in result.displays)  # the comparison figure
    tables = [d["text/html"] for d in result.displays if "Results (best first)" in d.get("text/html", "")]
    assert tables and tables[-1].count("<tr>") == 5  # header + one row per run
    check = kernel.run(
        "print([r.state for r in sweep_result.runs], net is sweep_result.best.net, "
        "info.final_validation_accuracy == max(i.final_validation_accuracy for i in sweep_result.infos))"
    )
    assert check.stdout.strip() == "['done', 'done', 'done', 'done'] True True", check.text


def test_train_magic_sweeps_with_the_cells_step_fn_and_shows_every_metric_in_its_table(kernel) -> None:
    assert kernel.run(SETUP).ok
    assert kernel.run(
        'opts = nbscale.TrainingOptions("sgdm", metrics=("accuracy", "fscore"), objective_metric="fscore")'
    ).ok
    result = kernel.run(
        """%%train --options opts --sweep "initial_learn_rate=0.2,0.4" --epochs 3
def make_model():
    return tiny_net()
train_data = (train_x, train_y)
val_data = val
def step_fn(model, inputs, labels):  # trains towards the next class: only its runs predict label + 1
    outputs = model(inputs)
    return torch.nn.functional.cross_entropy(outputs, (labels + 1) % 10), outputs
""",
        timeout=180,
    )
    assert result.ok, result.text
    tables = [d["text/html"] for d in result.displays if "Results (best first)" in d.get("text/html", "")]
    assert tables and all(
        column in tables[-1]
        for column in ("training fscore", "validation fscore", "validation accuracy", "validation loss")
    )
    check = kernel.run(
        "print([r.state for r in sweep_result.runs], "
        "min(nbscale.accuracy(n, (val[0], (val[1] + 1) % 10)) for n in sweep_result.nets) > 0.6, "
        "info.final_validation['fscore'] == max(i.final_validation['fscore'] for i in sweep_result.infos))"
    )
    assert check.stdout.strip() == "['done', 'done'] True True", check.text


def test_show_draws_a_run_with_trains_figure_while_the_notebook_keeps_working(kernel) -> None:
    assert kernel.run(SETUP).ok
    started = kernel.run("""
options = nbscale.TrainingOptions("sgdm", max_epochs=3000, mini_batch_size=500, verbose=False)
run = nbscale.train_async(tiny_net(), (train_x, train_y), options)
view = nbscale.show(run)
print("the cell returned while", run.name, "trains")
""")
    assert started.ok and "the cell returned while run trains" in started.stdout, started.text
    assert any(WIDGET_VIEW in d for d in started.displays)  # Stop
    # the info panel says what the run trains with (a single run has no grid values)
    panels = [d["text/plain"] for d in started.displays if d.get("text/plain", "").startswith("Run:")]
    assert panels
    assert "solver=sgdm, initial_learn_rate=0.01, mini_batch_size=500, max_epochs=3000" in panels[0], panels[0]
    meanwhile = kernel.run(
        """
while not run.info.iteration: time.sleep(0.1)
print(1 + 1, run.state)
""",
        timeout=60,
    )
    assert meanwhile.stdout.split() == ["2", "running"], meanwhile.text
    stopped = kernel.run(
        """
run.stop()
net, details = run.result(timeout=60)
while not view.finished: time.sleep(0.1)
from nbscale.ui.progress import TrainingProgress
print(details.stop_reason, run.state, len(view.png()) > 1000, isinstance(view, TrainingProgress),
      [a.get_ylabel() for a in view._figure.figure.axes[:2]], len(view.columns["loss"]) == len(details.iteration))
""",
        timeout=90,
    )
    # train's figure (accuracy and loss panels, every iteration), not the sweep's comparison figure
    assert stopped.stdout.strip() == "Stopped on request done True True ['Accuracy (%)', 'Loss'] True", stopped.text
    # the figure's output was made in show()'s cell; drawn from a thread, its updates also reach a client that
    # reads only the cell it runs (as nbclient does): here, the later cells
    assert any(d.get("text/plain", "").startswith("<training progress figure: waiting") for d in started.displays)
    assert any("image/png" in d for d in meanwhile.displays + stopped.displays), stopped.text
    assert any("Stopped on request" in d.get("text/plain", "") for d in stopped.displays), stopped.text


def test_train_magic_sweep_with_a_seed_repeats_its_results_and_seed_needs_a_sweep(kernel) -> None:
    assert kernel.run(SETUP).ok
    cell = """%%train --sweep "initial_learn_rate=0.05,0.2" --seed 3 --epochs 1 --no-plots --quiet
def make_model():
    return tiny_net()
train_data = (train_x, train_y)
val_data = val
"""
    first = kernel.run(cell, timeout=180)
    assert first.ok, first.text
    assert kernel.run("first = [i.final_validation_loss for i in sweep_result.infos]").ok
    second = kernel.run(cell, timeout=180)
    assert second.ok, second.text
    same = kernel.run("print(first == [i.final_validation_loss for i in sweep_result.infos])")
    assert same.stdout.strip() == "True", same.text
    alone = kernel.run("%%train --seed 3\nmodel = tiny_net()\ntrain_data = (train_x, train_y)\n")
    assert alone.error_name == "OptionsError" and "needs --sweep" in alone.error_value, alone.text


def test_the_runs_table_has_a_column_per_metric_and_no_accuracy_for_a_regression_run() -> None:
    from nbscale.training.run_table import run_row
    from nbscale.training.runs import TrainingRun
    from tests.metric_events import metric_run

    run = TrainingRun("r")
    for event in metric_run(("rmse", "mae")):
        run.info.record(event)
    row = run_row(run)
    assert "training accuracy" not in row and "validation accuracy" not in row
    assert row["training rmse"] == "0.9000" and row["validation mae"] == "0.9600"


def test_a_background_sweeps_display_updates_reach_the_later_cell_that_waits_for_it(kernel) -> None:
    assert kernel.run(SETUP).ok
    started = kernel.run(
        """
options = nbscale.TrainingOptions("sgdm", max_epochs=2, verbose=False)
result = nbscale.sweep(tiny_net, (train_x, train_y), options, {"initial_learn_rate": [0.05, 0.2]}, val_data=val,
                       wait=False)
""",
        timeout=60,
    )
    assert started.ok, started.text
    waited = kernel.run("result.wait(); print([run.state for run in result.runs])", timeout=180)
    assert waited.stdout.strip() == "['done', 'done']", waited.text
    # the outputs are show()'s cell's; a client reading only the waiting cell (nbclient) still gets their updates
    assert any("image/png" in d for d in waited.displays), waited.text
    assert any("Results (best first)" in d.get("text/html", "") for d in waited.displays), waited.text
