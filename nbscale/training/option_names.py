"""The names TrainingOptions answers besides its fields: MATLAB's, as keywords (a hint) or as name-value pairs
(`TrainingOptions("sgdm", "InitialLearnRate", 0.01)`, read as `initial_learn_rate=0.01`), and PyTorch's (a hint).

One rule serves both (`field_meant`): a MATLAB name means a field only when its CamelCase -> snake_case is that
field (InitialLearnRate -> initial_learn_rate) or `MATLAB_FIELDS` spells it so (OutputFcn -> output_fn). A MATLAB
option nbscale lacks (`MATLAB_ONLY`) is refused saying so; closeness (difflib) only suggests, in an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nbscale.errors import OptionsError
from nbscale.suggestions import close_names

# MATLAB's trainingOptions names whose nbscale field is spelt otherwise than their snake_case
MATLAB_FIELDS = {
    "ObjectiveMetricName": "objective_metric",
    "OutputFcn": "output_fn",
}

_LBFGS_LM = "an option of MATLAB's lbfgs and lm solvers; nbscale's solvers are sgdm, adam, adamw and rmsprop"
_SEQUENCES = "pad or cut sequences in the collate_fn of a DataLoader passed as train_data"
# MATLAB's trainingOptions names that nbscale has no option for, each with what to use instead ("": nothing close)
MATLAB_ONLY = {
    "PreprocessingEnvironment": "dispatch_in_background=True reads and augments in background processes "
    "(execution_environment is where training runs, not where data are read)",
    "CheckpointFrequencyUnit": "checkpoint_frequency counts epochs",
    "LearnRateScheduleSettings": "the piecewise schedule's settings are the fields learn_rate_drop_factor and "
    "learn_rate_drop_period",
    "SequenceLength": _SEQUENCES,
    "SequencePaddingValue": _SEQUENCES,
    "SequencePaddingDirection": _SEQUENCES,
    "InputDataFormats": "",
    "TargetDataFormats": "",
    "ResetInputNormalization": "",
    "BatchNormalizationStatistics": "",
    "MaxIterations": _LBFGS_LM,
    "LineSearchMethod": _LBFGS_LM,
    "MaxNumLineSearchIterations": _LBFGS_LM,
    "HistorySize": _LBFGS_LM,
    "InitialInverseHessianFactor": _LBFGS_LM,
    "GradientTolerance": _LBFGS_LM,
    "StepTolerance": _LBFGS_LM,
    "InitialDampingFactor": _LBFGS_LM,
    "MaxDampingFactor": _LBFGS_LM,
    "DampingIncreaseFactor": _LBFGS_LM,
    "DampingDecreaseFactor": _LBFGS_LM,
}

# PyTorch's names for what TrainingOptions holds under MATLAB's: each points to its field, or says what to do
PYTORCH_NAMES = {
    "lr": "the learn rate is initial_learn_rate=...",
    "learning_rate": "the learn rate is initial_learn_rate=...",
    "weight_decay": "L2 weight decay is l2_regularization=... (added to the gradients, as torch's weight_decay; "
    "for decoupled AdamW decay pass solver=lambda params: torch.optim.AdamW(params, weight_decay=...))",
    "label_smoothing": "not supported as an option: pass loss=torch.nn.CrossEntropyLoss(label_smoothing=0.1)",
    "patience": "early stopping is validation_patience=... (counted in validations, not epochs)",
    "epochs": "the number of epochs is max_epochs=...",
    "batch_size": "the mini-batch is mini_batch_size=...",
    "optimizer": "the optimizer is solver='sgdm'/'adam'/'adamw'/'rmsprop', or solver=lambda params: "
    "torch.optim.X(params, ...)",
    "scheduler": "the schedule is learn_rate_schedule='piecewise'/'cosine'/'warmup-cosine', or "
    "learn_rate_schedule=lambda optimizer: torch.optim.lr_scheduler.X(optimizer, ...)",
    "lr_scheduler": "the schedule is learn_rate_schedule=... (a name, or optimizer -> LRScheduler)",
    "clip_grad_norm": "gradient clipping is gradient_threshold=... with gradient_threshold_method='global-l2norm' "
    "(torch's clip_grad_norm_)",
    "max_grad_norm": "gradient clipping is gradient_threshold=... with gradient_threshold_method='global-l2norm'",
    "loss_fn": "the loss is loss=... (a name such as 'mse', or a function (outputs, targets) -> loss)",
}

_EXAMPLE = "initial_learn_rate=0.01, max_epochs=4"  # the keyword form, shown when the pairs give no names
_DOCS = "docs/training.md lists MATLAB's options beside nbscale's"


def snake_case(name: str) -> str:
    """MATLAB's CamelCase `name` in snake_case (InitialLearnRate -> initial_learn_rate, L2Regularization ->
    l2_regularization); any other name as it is."""
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", name):
        return name
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def field_meant(name: str, names: Sequence[str]) -> str | None:
    """The field among `names` that `name` means: itself, its snake_case (MATLAB's `InitialLearnRate` ->
    `initial_learn_rate`), or its entry in MATLAB_FIELDS (`OutputFcn` -> `output_fn`); None otherwise, however
    close a field's name is (a close one is only suggested, by `unknown_field_message`)."""
    meant = MATLAB_FIELDS.get(name, snake_case(name))
    return meant if meant in names else None


def matlab_only(name: str) -> str | None:
    """MATLAB's trainingOptions name that `name` is, itself or in snake_case, when nbscale has no such option."""
    return next((matlab for matlab in MATLAB_ONLY if name in (matlab, snake_case(matlab))), None)


def no_such_option_message(name: str, matlab: str) -> str:
    """The error for `name`, MATLAB's option `matlab` (or its snake_case), which nbscale does not have."""
    given = f"MATLAB's {name!r}" if name == matlab else f"{name!r} (MATLAB's {matlab})"
    instead = MATLAB_ONLY[matlab]
    return f"TrainingOptions got {given}, and nbscale has no such option" + (
        f": {instead}." if instead else f" ({_DOCS})."
    )


def unknown_field_message(name: str, names: Sequence[str], noun: str = "field") -> str:
    """The error for a keyword `name` that is no field: PyTorch's hint, the field a MATLAB name means, that
    nbscale has no such MATLAB option, or "did you mean" a close field and the fields (`noun`: what `name` is
    called, "option" for a name-value pair's name)."""
    if name in PYTORCH_NAMES:
        return f"TrainingOptions has no {noun} {name!r}: {PYTORCH_NAMES[name]} (docs/training.md, From PyTorch)."
    if (matlab := matlab_only(name)) is not None:
        return no_such_option_message(name, matlab)
    meant = field_meant(name, names)
    close = [meant] if meant else close_names(snake_case(name), names)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"TrainingOptions has no {noun} {name!r}.{hint} The fields are: {', '.join(names)}."


def options_from_pairs(solver: object, pairs: Sequence[object], names: Sequence[str]) -> dict[str, object]:
    """The keyword options that MATLAB's name-value `pairs` stand for, each name read as `field_meant` reads it.

    Raises OptionsError, in one line, for an odd count, a name that is not a string, a name that means no field
    (PyTorch's, a MATLAB option nbscale lacks, a typo: said as `unknown_field_message` says it), or two names
    meaning one field.
    """
    options: dict[str, object] = {}
    for position in range(0, len(pairs), 2):
        name = pairs[position]
        if not isinstance(name, str):
            raise OptionsError(
                f"TrainingOptions takes keywords, or MATLAB's name-value pairs after the solver, and {name!r} is "
                f"not an option name: write TrainingOptions({solver!r}, {_EXAMPLE})."
            )
        meant = field_meant(name, names)
        if meant is None:
            raise OptionsError(unknown_field_message(name, names, noun="option"))
        if meant in options:
            raise OptionsError(
                f"TrainingOptions: {name!r} and an earlier name both mean {meant!r}; "
                f"write {_keyword_form(solver, pairs, names)}."
            )
        if position + 1 == len(pairs):
            raise OptionsError(
                f"TrainingOptions: {name!r} has no value after it (name-value pairs come in twos); "
                f"write {_keyword_form(solver, pairs, names)}."
            )
        options[meant] = pairs[position + 1]
    return options


def _keyword_form(solver: object, pairs: Sequence[object], names: Sequence[str]) -> str:
    """`TrainingOptions('sgdm', initial_learn_rate=0.01, ...)`: `pairs` as keywords (an unknown name kept)."""
    keywords = []
    for position in range(0, len(pairs), 2):
        name = pairs[position]
        meant = field_meant(name, names) if isinstance(name, str) else None
        value = repr(pairs[position + 1]) if position + 1 < len(pairs) else "..."
        keywords.append(f"{meant or name}={value if len(value) <= 30 else '...'}")
    return f"TrainingOptions({solver!r}, {', '.join(keywords)})"
