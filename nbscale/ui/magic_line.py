"""The `%%train` line equivalent to a TrainingOptions: what the options form shows under "Train with"."""

from __future__ import annotations

from nbscale.training.options import TrainingOptions, field_names

# %%train's own flags and the field each sets
_MAGIC_FLAGS = (
    ("solver", "--solver"),
    ("execution_environment", "--env"),
    ("max_epochs", "--epochs"),
    ("mini_batch_size", "--batch-size"),
    ("initial_learn_rate", "--lr"),
)


def train_magic_line(options: TrainingOptions, name: str = "form") -> str:
    """`%%train` with flags when they say all of `options`, else `%%train --options NAME`.

    `%%train` without --options starts from TrainingOptions(solver, plots="training-progress"); a field that
    differs from that and has no flag of its own needs the options object, named `name` in the notebook.
    """
    if callable(options.solver):  # a factory has no flag: the options object says it
        return f"%%train --options {name}"
    base = TrainingOptions(options.solver, plots="training-progress")
    flags = ["%%train"]
    for field, flag in _MAGIC_FLAGS:
        if getattr(options, field) != getattr(base, field) or (field == "solver" and options.solver != "sgdm"):
            flags.append(f"{flag} {getattr(options, field)}")
    if options.plots == "none":
        flags.append("--no-plots")
    if not options.verbose:
        flags.append("--quiet")
    expressed = {field for field, _ in _MAGIC_FLAGS} | {"plots", "verbose"}
    rest = [
        f
        for f in field_names()
        if f not in expressed
        and getattr(options, f) is not getattr(base, f)
        and _differs(getattr(options, f), getattr(base, f))
    ]
    if rest:
        return f"%%train --options {name}"
    return " ".join(flags)


def _differs(a: object, b: object) -> bool:
    try:
        return bool(a != b)
    except Exception:  # tensors and the like: compared by identity above
        return True
