"""%%train's line as a user types it in a real kernel: bad result names are one clear line, nothing trains."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

CELL = (
    "\nimport torch\nmodel = torch.nn.Linear(4, 2)\n"
    "train_data = (torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))\n"
)


def test_result_names_that_cannot_be_variables_are_refused_before_the_cell_runs(kernel):
    keyword = kernel.run("%%train --net class" + CELL)
    assert keyword.error_name == "OptionsError"
    assert "--net class: 'class' is a Python keyword" in keyword.traceback and "--net trained" in keyword.traceback
    same = kernel.run("%%train --net net --info net" + CELL)
    assert same.error_name == "OptionsError"
    assert "--net and --info both name 'net'" in same.traceback and "different names" in same.traceback
    not_a_name = kernel.run("%%train --info 2x" + CELL)
    assert "--info 2x: the name for the result must be a Python identifier" in not_a_name.traceback
    assert kernel.run("print('model' in dir(), 'net' in dir())").stdout.split() == ["False", "False"]


def test_batch_size_auto_reaches_the_options_and_is_refused_on_the_cpu_naming_the_fix(kernel):
    refused = kernel.run("%%train --batch-size auto --env cpu" + CELL)
    assert refused.error_name == "OptionsError"
    assert (
        "mini_batch_size='auto' fits the mini-batch to GPU memory, but this run trains on the CPU: give a "
        "number" in refused.traceback
    )
    wrong = kernel.run("%%train --batch-size lots" + CELL)
    assert "UsageError: argument --batch-size: 'lots' is not a whole number or auto" in wrong.stderr


def test_env_and_solver_are_taken_in_any_case_as_matlab_takes_them(kernel):
    trained = kernel.run("%%train --env CPU --solver Adam --epochs 1 --batch-size 4 --no-plots --quiet" + CELL)
    assert trained.ok, trained.text
    assert kernel.run("print(info.hardware.startswith('CPU'), type(net).__name__)").stdout.split() == ["True", "Linear"]
    wrong = kernel.run("%%train --env GPUs" + CELL)
    assert "UsageError: argument -e/--execution-environment/--env: invalid choice: 'gpus'" in wrong.stderr
    short = kernel.run("%%train -e cpu --epochs 1 --batch-size 4 --no-plots --quiet" + CELL)
    assert short.ok, short.text
    full = kernel.run("%%train --execution-environment cpu --epochs 1 --batch-size 4 --no-plots --quiet" + CELL)
    assert full.ok, full.text


def test_options_that_name_no_training_options_say_how_to_create_them(kernel):
    missing = kernel.run("%%train --options opts" + CELL)
    assert missing.error_name == "OptionsError"
    assert (
        "--options opts: no notebook variable named 'opts'. Create it in an earlier cell: opts = "
        "nbscale.TrainingOptions('sgdm', ...)" in missing.traceback
    )
    assert kernel.run("opts = 5").ok
    wrong = kernel.run("%%train --options opts" + CELL)
    assert (
        "--options opts: opts holds an int, not TrainingOptions or an options form: set opts = "
        "nbscale.TrainingOptions('sgdm', ...)" in wrong.traceback
    )
    assert "Traceback" not in wrong.traceback  # the message alone


def test_a_cell_whose_loss_fn_is_a_loss_class_gets_the_fix_not_a_torch_error(kernel):
    refused = kernel.run("%%train --no-plots --quiet" + CELL + "loss_fn = torch.nn.CrossEntropyLoss\n")
    assert refused.error_name == "OptionsError"
    assert (
        "loss_fn is the class CrossEntropyLoss, not a loss: create one, e.g. loss_fn=CrossEntropyLoss()"
        in refused.traceback
    )
    assert "Traceback" not in refused.traceback


def test_a_cell_may_define_step_fn_which_replaces_forward_and_loss(kernel):
    trained = kernel.run(
        "%%train --no-plots --quiet --epochs 2 --batch-size 4"
        + CELL
        + """
calls = []
def step_fn(model, inputs, targets):
    calls.append(len(inputs))
    outputs = model(inputs)
    return torch.nn.functional.cross_entropy(outputs, targets), outputs
"""
    )
    assert trained.ok, trained.text
    assert kernel.run("print(calls, len(info.iteration))").stdout.strip() == "[4, 4, 4, 4] 4"
