"""The loop's side of a checkpoint: when one is due, and the run state it restores (the file's format and
checks are nbscale.training.checkpoint's)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbscale.training.best_validation import Best
from nbscale.training.events import IterationDone
from nbscale.training.options import FACTORY_FIELDS, TrainingOptions, shown_choice


def checkpoint_due(options: TrainingOptions, epoch: int) -> bool:
    """True when `epoch`'s end saves a checkpoint (every rank tells the same)."""
    return bool(options.checkpoint_path) and epoch % options.checkpoint_frequency == 0


def restored(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    schedule: Any,
) -> tuple[int, int, list[IterationDone], Best]:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state.get("schedule") or {})
    if state.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return state["epoch"], state["iteration"], list(state["history"]), Best.restored(state["best"])


def plain_options(options: TrainingOptions) -> dict[str, Any]:
    # a factory is kept as "custom" (check_resume compares solvers by that name)
    return {
        k: shown_choice(v) if k in FACTORY_FIELDS else v
        for k, v in options.to_dict().items()
        if k not in ("validation_data", "output_fn")
    }
