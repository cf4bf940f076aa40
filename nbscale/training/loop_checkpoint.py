"""The loop's side of a checkpoint: the run state it restores (when one is due is the plan's CheckpointRule; the
file's format and checks are nbscale.training.checkpoint's)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbscale.training.best_validation import Best
from nbscale.training.events import IterationDone


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
