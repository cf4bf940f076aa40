"""%%train, the live display, the Stop button and the kernel interrupt, through a real kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_session import needs_clicks_mid_cell
from tests.training.widget_click import run_and_click

pytestmark = pytest.mark.slow

SETUP = """
import torch
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
"""

LONG_CELL = """%%train --epochs 5000 --batch-size 32 --lr 0.05 --quiet
model = tiny_net()
train_data = (train_x, train_y)
val_data = val
"""


def test_train_magic_defines_net_and_info_and_leaves_a_png_figure(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = kernel.run("""%%train --epochs 3 --batch-size 64 --lr 0.1 --net trained --info details
model = tiny_net()
train_data = (train_x, train_y)
val_data = val
""")
    assert result.ok, result.text
    assert "Training finished: Max epochs completed" in result.stdout  # the verbose table
    assert any("image/png" in d for d in result.displays)  # the final figure is a plain PNG
    check = kernel.run("print(type(trained).__name__, details.stop_reason, len(details.iteration))")
    assert check.stdout.split() == ["Sequential", "Max", "epochs", "completed", str(3 * (1500 // 64))]


def test_kernel_interrupt_stops_at_the_end_of_the_iteration_and_keeps_the_net(kernel) -> None:
    assert kernel.run(SETUP).ok
    # a first short run starts CUDA (seconds in a fresh kernel on a GPU machine, where "auto" trains on the GPU)
    # and matplotlib, so the timed run below trains for most of its 4 seconds
    assert kernel.run(LONG_CELL.replace("--epochs 5000", "--epochs 1")).ok
    result = kernel.run(LONG_CELL, interrupt_after=4.0, timeout=60)
    assert result.ok, result.text  # no KeyboardInterrupt traceback: the net so far is returned
    # the figure was shown empty, updated while training ran (at most a few times a second), and shown at the end
    figures = sum("image/png" in shown for shown in result.displays)
    assert 3 <= figures <= 2 + 4.0 / 0.5 + 1
    check = kernel.run("print(info.stop_reason); print(info.iteration[-1] < 5000 * 46)")
    assert check.stdout.splitlines() == ["Stopped by kernel interrupt", "True"]


def test_an_interrupt_of_a_run_reading_in_background_processes_is_said_once(kernel) -> None:
    """The kernel's interrupt reaches the DataLoader processes of dispatch_in_background=True too (one process
    group); they inherit the Stop handler, and each printed the Stop line into the cell."""
    assert kernel.run(
        SETUP + "import nbscale\nbackground = nbscale.TrainingOptions('sgdm', dispatch_in_background=True)"
    ).ok
    cell = LONG_CELL.replace("--quiet", "--quiet --no-plots --options background")
    result = kernel.run(
        cell.replace("(train_x, train_y)", "torch.utils.data.TensorDataset(train_x, train_y)"),
        interrupt_after=4.0,
        timeout=60,
    )
    assert result.ok, result.text
    assert result.text.count("Stopping at the end of this iteration") == 1, result.text
    check = kernel.run("print(info.stop_reason); print(info.data_placement)")
    assert check.stdout.splitlines()[0] == "Stopped by kernel interrupt"
    assert check.stdout.splitlines()[1].startswith("streamed by a DataLoader (")


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_run_reading_in_background_processes_that_fails_leaves_none_of_them_behind(kernel) -> None:
    """The notebook keeps a failed cell's traceback, whose frames hold the DataLoader: its processes lived on,
    two more with every failed run."""
    assert kernel.run(
        SETUP + "import nbscale\n"
        "background = nbscale.TrainingOptions('sgdm', dispatch_in_background=True, verbose=False)"
    ).ok
    for _ in range(2):
        failed = kernel.run(
            "nbscale.train(torch.nn.Linear(5, 10), torch.utils.data.TensorDataset(train_x, train_y), background)"
        )
        assert failed.error_name == "ModelError"
    assert children(kernel.pid) == []


def test_a_run_whose_data_fails_to_read_in_a_background_process_leaves_none_of_them_behind(kernel) -> None:
    """The read error comes back through the DataLoader's iterator, whose frames the kept traceback holds: the
    iterator is never freed, so stopping its processes cannot wait for torch to free it."""
    assert kernel.run(
        SETUP + "import nbscale\n"
        "background = nbscale.TrainingOptions('sgdm', dispatch_in_background=True, verbose=False)\n"
        "class Unreadable(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n"
        "        return len(train_y)\n"
        "    def __getitem__(self, index):\n"
        "        if index >= 100:\n"
        "            raise OSError(f'image {index} is corrupt')\n"
        "        return train_x[index], train_y[index]\n"
    ).ok
    failed = kernel.run("nbscale.train(tiny_net(), Unreadable(), background)")
    assert "image" in failed.text and "is corrupt" in failed.text, failed.text
    assert children(kernel.pid) == []


def test_a_warning_of_a_train_cell_names_the_cell_not_ipython(kernel) -> None:
    """In a %%train cell, IPython's frames run the training: the warning named interactiveshell.py's line."""
    assert kernel.run(SETUP).ok
    assert kernel.run("import nbscale\nmixed = nbscale.TrainingOptions('sgdm', precision='mixed', verbose=False)").ok
    result = kernel.run(
        "%%train --options mixed --epochs 1 --no-plots\nmodel = tiny_net()\ntrain_data = (train_x, train_y)"
    )
    assert result.ok, result.text
    # the cell's first line: the %%train line, as IPython runs it
    assert ".py:1: RuntimeWarning: precision='mixed' only speeds up GPUs" in result.stderr, result.stderr
    assert "run_cell_magic('train', '--options mixed" in result.stderr and "IPython" not in result.stderr
    called = kernel.run("net, info = nbscale.train(tiny_net(), (train_x, train_y), mixed)")
    assert ".py:1: RuntimeWarning: precision='mixed'" in called.stderr and "nbscale.train(" in called.stderr


@needs_clicks_mid_cell
def test_stop_button_stops_training_while_the_cell_runs(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = run_and_click(kernel, LONG_CELL, click_after=2.0, timeout=60)
    assert result.ok, result.text
    # it stopped early and kept the iterations it trained (how many depends on the machine's load)
    check = kernel.run("print(info.stop_reason); print(0 < len(info.iteration) and info.iteration[-1] < 5000 * 46)")
    assert check.stdout.splitlines() == ["Stopped by the Stop button", "True"]


def test_train_magic_uses_only_what_the_cell_defines_not_names_left_from_earlier_cells(kernel) -> None:
    assert kernel.run(SETUP).ok
    # a regression cell defines loss_fn and val_data ...
    first = kernel.run("""%%train --epochs 1 --batch-size 100 --quiet --no-plots
model = torch.nn.Linear(64, 2)
train_data = (train_x, train_x[:, :2])
val_data = (val[0], val[0][:, :2])
loss_fn = torch.nn.MSELoss()
""")
    assert first.ok, first.text
    # ... the next cell defines neither: cross-entropy and no validation, whatever the notebook still holds
    second = kernel.run("""%%train --epochs 1 --batch-size 100 --quiet --no-plots
model = tiny_net()
train_data = (train_x, train_y)
""")
    assert second.ok, second.text
    check = kernel.run("print(info.final_validation_loss, info.training_accuracy[-1] is not None)")
    assert check.stdout.split() == ["None", "True"], check.text
    # a loss defined with def counts as defined by the cell
    third = kernel.run("""%%train --epochs 1 --batch-size 100 --quiet --no-plots
def loss_fn(outputs, labels):
    return torch.nn.functional.cross_entropy(outputs, labels) * 0
model = tiny_net()
train_data = (train_x, train_y)
""")
    assert third.ok, third.text
    assert kernel.run("print(set(info.training_loss))").stdout.strip() == "{0.0}"
    # model left from an earlier cell: the cell must define it
    missing = kernel.run("%%train --epochs 1 --quiet --no-plots\ntrain_data = (train_x, train_y)\n")
    assert missing.error_name == "OptionsError"
    assert "must define model (model from an earlier cell is not used" in missing.error_value


def test_an_error_in_the_train_cell_fails_the_cell_and_trains_nothing(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = kernel.run(
        "%%train --epochs 1 --quiet --no-plots\nmodel = tiny_net()\ntrain_data = (train_x, train_y)\n1 / 0"
    )
    assert result.error_name == "NbscaleError" and "nothing was trained" in result.error_value  # Run All stops here
    assert "ZeroDivisionError" in result.text  # the cell's own error is shown too
    assert kernel.run("print('info' in globals())").stdout.strip() == "False"


def test_the_cells_val_data_wins_over_the_options_validation_data(kernel) -> None:
    assert kernel.run(
        SETUP + "import nbscale\n"
        "one = nbscale.TrainingOptions('sgdm', initial_learn_rate=0.1, max_epochs=1, verbose=False, "
        "validation_data=(train_x[:1], train_y[:1]))"
    ).ok
    result = kernel.run(
        "%%train --options one --no-plots\nmodel = tiny_net()\ntrain_data = (train_x, train_y)\nval_data = val"
    )
    assert result.ok, result.text
    # one validation sample gives 0 or 1; the cell's 297 give a fraction in between
    assert kernel.run("print(0 < info.final_validation_accuracy < 1)").stdout.strip() == "True"
    # val_data = None in the cell trains without the options' validation data
    result = kernel.run(
        "%%train --options one --no-plots\nmodel = tiny_net()\ntrain_data = (train_x, train_y)\nval_data = None"
    )
    assert result.ok, result.text
    assert kernel.run("print(info.final_validation_accuracy, set(info.validation_loss))").stdout.split() == [
        "None",
        "{None}",
    ]


def test_an_interrupt_while_the_pool_starts_stops_parallel_training_at_its_first_iteration(kernel) -> None:
    assert kernel.run(SETUP).ok
    # the grace before workers are interrupted (3 s of the pool running the training) is not what this test checks,
    # and a busy machine can spend longer than that setting up the first iteration
    assert kernel.run("import nbscale.training.trainer\nnbscale.training.trainer.STOP_GRACE_S = 60.0").ok
    result = kernel.run(
        "%%train --env parallel --epochs 10 --batch-size 32 --no-plots\n"
        "model = tiny_net()\ntrain_data = (train_x, train_y)",
        interrupt_when=kernel.forkserver_running,  # the pool has begun to start
        timeout=120,
    )
    assert result.ok, result.text
    assert "Training finished: Stopped by kernel interrupt." in result.stdout  # the table agrees with info
    check = kernel.run("print(info.stop_reason); print(info.iteration[-1] < 10 * 46)")
    assert check.stdout.splitlines() == ["Stopped by kernel interrupt", "True"]
