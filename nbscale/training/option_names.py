"""The names TrainingOptions answers besides its fields: MATLAB's, as keywords (a hint) or as name-value pairs
(`TrainingOptions("sgdm", "InitialLearnRate", 0.01)`, read as `initial_learn_rate=0.01`), and PyTorch's (a hint).

One mapping serves both: a MATLAB name means the field that the unknown-keyword hint names (`field_meant`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nbscale.errors import OptionsError
from nbscale.suggestions import close_names

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


def field_meant(name: str, names: Sequence[str]) -> str | None:
    """The field among `names` that `name` means: itself, or the closest (MATLAB's `InitialLearnRate` ->
    `initial_learn_rate`); None when none is close or `name` is PyTorch's (those get their own hint)."""
    if name in names:
        return name
    if name in PYTORCH_NAMES:
        return None
    close = close_names(name, names)
    return close[0] if close else None


def unknown_field_message(name: str, names: Sequence[str]) -> str:
    """The error for a keyword `name` that is no field: PyTorch's hint, or "did you mean" and the fields."""
    if name in PYTORCH_NAMES:
        return f"TrainingOptions has no field {name!r}: {PYTORCH_NAMES[name]} (docs/training.md, From PyTorch)."
    meant = field_meant(name, names)
    hint = f" Did you mean {meant!r}?" if meant else ""
    return f"TrainingOptions has no field {name!r}.{hint} The fields are: {', '.join(names)}."


def options_from_pairs(solver: object, pairs: Sequence[object], names: Sequence[str]) -> dict[str, object]:
    """The keyword options that MATLAB's name-value `pairs` stand for, each name read as `field_meant` reads it.

    Raises OptionsError, in one line showing the keyword form, for an odd count, a name that is not a string, a
    name no field is close to, or two names meaning one field.
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
        if name in PYTORCH_NAMES:
            raise OptionsError(unknown_field_message(name, names))
        if meant is None or meant in options:
            why = f"{name!r} and an earlier name both mean {meant!r}" if meant else f"{name!r} is no option"
            raise OptionsError(f"TrainingOptions: {why}; write {_keyword_form(solver, pairs, names)}.")
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
