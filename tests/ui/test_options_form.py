"""The training-options form driven in a real kernel: values, validation, the magic line through %%train,
and %train_options bound to a variable (edited the way a browser does, through the widget's comm)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.kernel_session import KernelSession

pytestmark = pytest.mark.slow

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# %%train calls nbscale.training.trainer.train; a stand-in records the options it gets instead of training
CAPTURE = """
import torch, nbscale, nbscale.training.trainer as trainer
captured = []
trainer.train_planned = lambda model, checked, *rest, **keywords: (
    captured.append(checked.options), (model, None))[1]
"""
CELL_BODY = "\nmodel = torch.nn.Linear(64, 10)\ntrain_data = (torch.zeros(8, 64), torch.zeros(8, dtype=torch.long))\n"


def _magic_line(kernel: KernelSession) -> str:
    result = kernel.run("print(form.magic_line())")
    assert result.ok, result.text
    return result.stdout.strip()


def test_form_values_become_options_and_the_magic_line_round_trips_through_train(kernel) -> None:
    assert kernel.run(CAPTURE).ok
    shown = kernel.run("form = nbscale.options_form()")
    assert shown.ok, shown.text
    assert sum(WIDGET_VIEW in d for d in shown.displays) == 1  # shown once, as a widget
    edit = kernel.run("""
w = form.widgets
w["solver"].value = "adam"
w["max_epochs"].value = 3
w["mini_batch_size"].value = "64"
w["initial_learn_rate"].value = 0.02
w["verbose"].value = False
w["execution_environment"].value = "cpu"
o = form.options
print(o.solver, o.max_epochs, o.mini_batch_size, o.initial_learn_rate, o.verbose, o.execution_environment)
""")
    assert edit.stdout.split() == ["adam", "3", "64", "0.02", "False", "cpu"], edit.text
    line = _magic_line(kernel)
    assert line == "%%train --solver adam --env cpu --epochs 3 --batch-size 64 --lr 0.02 --quiet"
    assert kernel.run(line + CELL_BODY).ok
    # a field %%train has no flag for: the line names the form instead
    kernel.run(
        'form.widgets["learn_rate_schedule"].value = "piecewise"; form.widgets["gradient_threshold"].value = "2.5"'
    )
    line = _magic_line(kernel)
    assert line == "%%train --options form"
    assert kernel.run(line + CELL_BODY).ok
    check = kernel.run(
        "print(captured[0] == captured[1].replace(learn_rate_schedule='none', gradient_threshold="
        "float('inf')), captured[1] == form.options, captured[1].gradient_threshold)"
    )
    assert check.stdout.split() == ["True", "True", "2.5"], check.text


def test_the_mini_batch_size_box_takes_auto_and_the_magic_line_passes_it_on(kernel) -> None:
    assert kernel.run(CAPTURE + "form = nbscale.options_form(show=False)").ok
    result = kernel.run("""
w = form.widgets
w["mini_batch_size"].value = "auto"
w["learn_rate_scaling"].value = "linear"
w["learn_rate_reference_batch"].value = 256
print(form.valid, form.options.mini_batch_size, form.options.learn_rate_reference_batch)
w["mini_batch_size"].value = "lots"
print("mini_batch_size" in form.errors, "write a whole number, or auto" in form.messages["mini_batch_size"].value)
w["mini_batch_size"].value = "auto"
w["learn_rate_scaling"].value = "none"
w["learn_rate_reference_batch"].value = 128
""")
    assert result.stdout.split() == ["True", "auto", "256", "True", "True"], result.text
    line = _magic_line(kernel)
    assert line == "%%train --batch-size auto"
    assert kernel.run(line + CELL_BODY).ok
    assert kernel.run("print(captured[0].mini_batch_size)").stdout.strip() == "auto"


def test_impossible_values_are_shown_inline_and_stop_train_before_a_run(kernel) -> None:
    assert kernel.run(CAPTURE + "form = nbscale.options_form(show=False)").ok
    result = kernel.run("""
w = form.widgets
w["max_epochs"].value = 0            # kept as typed (not clamped to 1) and shown wrong
w["momentum"].value = 1.5
print(w["max_epochs"].value, sorted(form.errors), "in [1, 1000000]" in form.messages["max_epochs"].value)
w["max_epochs"].value, w["momentum"].value = 5, 0.9
w["initial_learn_rate"].value = -1.0
print(form.valid, "initial_learn_rate" in form.errors,
      "must be a finite number &gt; 0" in form.messages["initial_learn_rate"].value)
""")
    assert result.stdout.split() == ["0", "['max_epochs',", "'momentum']", "True", "False", "True", "True"], result.text
    refused = kernel.run("%%train --options form" + CELL_BODY)
    assert refused.error_name == "OptionsError" and "initial_learn_rate" in refused.error_value
    assert "Traceback" not in refused.traceback  # the message alone
    combination = kernel.run("""
w["initial_learn_rate"].value = 0.01
w["output_network"].value = "best-validation"   # needs validation data
print(sorted(form.errors), "needs validation_data" in form.messages["output_network"].value)
""")
    assert combination.stdout.split() == ["['output_network']", "True"], combination.text
    assert kernel.run("print(len(captured))").stdout.strip() == "0"  # nothing was trained


def test_train_options_magic_binds_a_variable_and_trains_with_it(kernel) -> None:
    setup = kernel.run("""
import torch, nbscale
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
""")
    assert setup.ok, setup.text
    shown = kernel.run("f = %train_options opts\nprint(type(opts).__name__, opts.max_epochs, opts.plots)")
    assert shown.stdout.split() == ["TrainingOptions", "30", "training-progress"], shown.text
    assert sum(WIDGET_VIEW in d for d in shown.displays) == 1
    ids = kernel.run(
        'w = f.widgets\nprint(w["max_epochs"].model_id, w["validation_data"].model_id, '
        'w["validation_data"].options.index("val"))'
    ).stdout.split()
    _browser_sets(kernel, ids[0], {"value": 2})  # the user types 2 in the max_epochs box
    _browser_sets(kernel, ids[1], {"index": int(ids[2])})  # and picks `val` in the validation_data list
    check = kernel.run("print(opts.max_epochs, opts.validation_data is val, f.magic_line('opts'))")
    assert check.stdout.split() == ["2", "True", "%%train", "--options", "opts"], check.text
    trained = kernel.run(
        "%%train --options opts --quiet --no-plots\nmodel = tiny_net()\ntrain_data = (train_x, train_y)"
    )
    assert trained.ok, trained.text
    done = kernel.run("print(info.max_epochs, info.final_validation_accuracy is not None)")
    assert done.stdout.split() == ["2", "True"], done.text


def test_a_field_of_form_options_set_from_code_shows_in_the_form_and_is_what_train_uses(kernel) -> None:
    assert kernel.run("import torch, nbscale\nform = nbscale.options_form()").ok
    edit = kernel.run("""
form.options.max_epochs = 2
form.options.verbose = False
print(form.widgets["max_epochs"].value, form.options.max_epochs, form.widgets["verbose"].value, form.options.verbose)
""")
    assert edit.stdout.split() == ["2", "2", "False", "False"], edit.text
    refused = kernel.run("form.options.max_epochs = 0")
    assert refused.error_name == "OptionsError" and "max_epochs" in refused.error_value, refused.text
    assert kernel.run("print(form.options.max_epochs)").stdout.strip() == "2"  # a refused value changes nothing
    trained = kernel.run(
        "%%train --options form --no-plots\nmodel = torch.nn.Linear(64, 10)\n"
        "train_data = (torch.randn(256, 64), torch.randint(0, 10, (256,)))"
    )
    assert trained.ok, trained.text
    assert kernel.run("print(info.epoch[-1])").stdout.strip() == "2"
    whole = kernel.run(
        "form.options = nbscale.TrainingOptions('adam', max_epochs=4)\n"
        "print(form.widgets['solver'].value, form.options.max_epochs, type(form.options).__name__)"
    )
    assert whole.stdout.split() == ["adam", "4", "TrainingOptions"], whole.text


def _browser_sets(kernel: KernelSession, model_id: str, state: dict) -> None:
    """Send a widget state update on the shell channel, as JupyterLab does when the user edits a widget."""
    client = kernel.client
    content = {"comm_id": model_id, "data": {"method": "update", "state": state, "buffer_paths": []}}
    client.shell_channel.send(client.session.msg("comm_msg", content))
    assert kernel.run("pass").ok  # the kernel handles messages in order: the update is in once this ran


def test_in_a_script_the_form_is_returned_without_printing_its_widgets() -> None:
    script = "import nbscale\nform = nbscale.options_form()\nprint(form.options.max_epochs)"
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "30\n"  # not the thousands of characters of the widgets' repr


def test_factory_solver_and_schedule_show_as_custom_and_come_back_unchanged(kernel) -> None:
    assert kernel.run(CAPTURE).ok
    made = kernel.run("""
adamw = lambda params: torch.optim.AdamW(params, lr=1e-3)
steps = lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
form = nbscale.options_form(nbscale.TrainingOptions(solver=adamw, learn_rate_schedule=steps))
w = form.widgets
print(w["solver"].label, w["learn_rate_schedule"].label, form.options.solver is adamw,
      form.options.learn_rate_schedule is steps, form.magic_line())
""")
    assert made.ok, made.text
    assert made.stdout.split() == ["custom", "custom", "True", "True", "%%train", "--options", "form"], made.text
    assert kernel.run('w["solver"].value = "adam"\nprint(form.options.solver)').stdout.strip() == "adam"


def test_a_form_unwraps_to_its_options_and_anything_else_stays_as_it_is() -> None:
    from nbscale import OptionsError, TrainingOptions, options_form
    from nbscale.training.options import as_options, unwrap_form

    form, plain = options_form(TrainingOptions("adam", max_epochs=3), show=False), TrainingOptions("sgdm")
    assert unwrap_form(form) == TrainingOptions("adam", max_epochs=3) == as_options(form)
    assert unwrap_form(plain) is plain and unwrap_form(7) == 7
    with pytest.raises(OptionsError, match="options must be a TrainingOptions .* not int"):
        as_options(7)
