"""docs/reference.md, made from the code: every magic and flag (their parsers), every TrainingOptions field (its
default and allowed values from the checks), every NBSCALE_* variable. `make reference` rewrites the page;
tests/test_docs_reference.py fails when the page is not what this makes, so a new flag or field cannot go
undocumented. The one-line descriptions and MATLAB names below are the only hand-written parts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"

# MATLAB's trainingOptions/trainnet name of each field ("" where MATLAB has none), and what it does
FIELDS: dict[str, tuple[str, str]] = {
    "solver": ("solverName", "the optimizer: a name, or a function params -> torch.optim.Optimizer"),
    "initial_learn_rate": ("InitialLearnRate", "the learn rate at the start (None: the solver's default)"),
    "momentum": ("Momentum", "sgdm's momentum"),
    "gradient_decay_factor": ("GradientDecayFactor", "adam's beta1"),
    "squared_gradient_decay_factor": ("SquaredGradientDecayFactor", "adam's beta2, rmsprop's alpha"),
    "epsilon": ("Epsilon", "the denominator's offset of adam and rmsprop"),
    "l2_regularization": ("L2Regularization", "weight decay (decoupled for adamw)"),
    "gradient_threshold": ("GradientThreshold", "clip gradients above this (inf: no clipping)"),
    "gradient_threshold_method": ("GradientThresholdMethod", "how to clip: per parameter, global norm, or values"),
    "max_epochs": ("MaxEpochs", "epochs to train"),
    "mini_batch_size": ("MiniBatchSize", "the global mini-batch; 'auto' fits GPU memory"),
    "shuffle": ("Shuffle", "when the training data are shuffled"),
    "learn_rate_schedule": ("LearnRateSchedule", "a schedule name, or a function optimizer -> LRScheduler"),
    "learn_rate_drop_factor": ("LearnRateDropFactor", "piecewise: the factor of each drop"),
    "learn_rate_drop_period": ("LearnRateDropPeriod", "piecewise: epochs between drops"),
    "validation_data": ("ValidationData", "a Dataset, DataLoader or (inputs, labels) validated on"),
    "validation_frequency": ("ValidationFrequency", "iterations between validations"),
    "validation_patience": ("ValidationPatience", "validations without improvement before stopping"),
    "output_network": ("OutputNetwork", "the network returned: the last or the best validated"),
    "execution_environment": ("ExecutionEnvironment", "where training runs: the switch"),
    "worker_load": ("WorkerLoad", "each pool worker's share of every mini-batch"),
    "dispatch_in_background": ("DispatchInBackground", "read and augment in background processes"),
    "precision": ("", "'mixed': bf16/fp16 autocast on GPUs"),
    "plots": ("Plots", "the live training-progress figure"),
    "verbose": ("Verbose", "print the progress table"),
    "verbose_frequency": ("VerboseFrequency", "iterations between table rows"),
    "checkpoint_path": ("CheckpointPath", "a folder for checkpoints (None: none)"),
    "checkpoint_frequency": ("CheckpointFrequency", "epochs between checkpoints"),
    "output_fn": ("OutputFcn", "called with each iteration's state; returning True stops"),
    "data_placement": ("", "keep the data on the training device, stream them, or decide"),
    "compile": ("", "train the network through torch.compile"),
    "on_worker_failure": ("", "'restart': a lost worker restarts the pool and training resumes"),
    "learn_rate_scaling": ("", "'linear': scale the learn rate with the global mini-batch"),
    "learn_rate_reference_batch": ("", "the mini-batch initial_learn_rate is meant for, under 'linear'"),
    "learn_rate_schedule_step": ("", "a schedule function is stepped every iteration or every epoch"),
    "loss": ("trainnet's lossFcn", "the loss: a name or a function (outputs, targets) -> loss"),
    "metrics": ("Metrics", "metrics computed, plotted and recorded"),
    "objective_metric": ("ObjectiveMetricName", "what validation_patience and best-validation follow"),
    "objective_goal": ("", "whether objective_metric is better lower or higher"),
    "loggers": ("", "objects receiving every metric: CSVLogger, TensorBoardLogger"),
}

VARIABLES: dict[str, str] = {
    "NBSCALE_HOME": "nbscale's data folder (the job store is `jobs` in it); default: the user's data folder",
    "NBSCALE_JOB_DIR": "set by nbscale inside a job: the job's own folder",
    "NBSCALE_JOB_CLUSTER": "set by nbscale inside a Ray job: the job's pool runs on that cluster",
    "NBSCALE_PROFILES": "the cluster profiles file; default `~/.config/nbscale/profiles.toml`",
    "NBSCALE_RUNTIME_DIR": (
        "where pools publish their state for the lab panel, and the zygotes' sockets; default Jupyter's runtime folder"
    ),
    "NBSCALE_ZYGOTE": (
        "`0`: each local pool starts its forkserver as a fresh interpreter instead of forking it from the zygote"
        " ([pool.md](pool.md#how-it-works))"
    ),
    "NBSCALE_GPU_REGISTRY": "the folder of GPU reservations; default /dev/shm, else /tmp",
    "NBSCALE_SHM_DIR": "the folder of large buffers between kernel and workers; default /dev/shm",
    "NBSCALE_SERVER_KEEPS_KERNEL_STATUS": (
        "set (`1`) by nbscale's server extension for the kernels its Jupyter server starts: their widget messages"
        " leave the status bar Busy, so their live figures are drawn in the browser ([ui.md](ui.md))"
    ),
    "NBSCALE_MAX_IMAGE_PIXELS": (
        "the most pixels an image file's header may claim before it is decoded; default 100000000"
    ),
}


def _magic_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(%name or %%name, parser) of every magic nbscale registers."""
    import importlib

    from nbscale.magics import _MAGIC_CLASSES

    found = []
    for module_name, class_name in _MAGIC_CLASSES:
        magics_class = getattr(importlib.import_module(module_name), class_name)
        for kind, names in magics_class.magics.items():
            for name, method_name in names.items():
                parser = getattr(getattr(magics_class, method_name), "parser", None)
                if parser is not None:
                    found.append((("%" if kind == "line" else "%%") + name, parser))
    return sorted(found)


def magic_flags() -> dict[str, set[str]]:
    """Every magic's option strings (`--epochs`, `-e`...)."""
    return {
        name: {flag for action in parser._actions for flag in action.option_strings}
        for name, parser in _magic_parsers()
    }


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def _allowed(name: str) -> str:
    from nbscale.training.options import _CHECKS

    words = _CHECKS[name](object())  # a value no check takes: the check answers with what it takes
    return (words or "any").replace("|", "\\|")


def render() -> str:
    from nbscale.training.options import TrainingOptions, field_names

    defaults = TrainingOptions()
    lines = [
        "# Reference",
        "",
        "Every magic and flag, every `TrainingOptions` field and every `NBSCALE_*` variable. This page is made "
        "from the code (`make reference`); a test fails when it is out of date.",
        "",
        "## Magics",
        "",
    ]
    for name, parser in _magic_parsers():
        lines += [
            f"### `{name}`",
            "",
            _first_sentence(parser.description or ""),
            "",
            "| argument | what it does |",
            "|---|---|",
        ]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
            lines.append(f"| {flag} | {(action.help or '').replace('|', '/')} |")
        lines.append("")
    lines += [
        "## TrainingOptions",
        "",
        "`nbscale.TrainingOptions(solver, **fields)`; a wrong name or value is an OptionsError naming the field.",
        "",
        "| field | default | takes | MATLAB | what it does |",
        "|---|---|---|---|---|",
    ]
    for field in field_names():
        matlab, what = FIELDS[field]
        default = repr(getattr(defaults, field)) if field != "solver" else "'sgdm'"
        lines.append(f"| `{field}` | `{default}` | {_allowed(field)} | {f'`{matlab}`' if matlab else ''} | {what} |")
    lines += ["", "## Environment variables", "", "| variable | what it sets |", "|---|---|"]
    lines += [f"| `{name}` | {what} |" for name, what in VARIABLES.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if "--write" in sys.argv:
        PAGE.write_text(render())
    else:
        print(render())
