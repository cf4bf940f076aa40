"""The best validation so far and the stops validation decides: a NaN objective, patience met."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nbscale.training.plan_rules import ValidationRule
from nbscale.training.run_metrics import Objective


@dataclass
class Best:
    """The best validation so far by the objective's score (lower is better: Objective.score): its score, its
    iteration, its network's state (kept under output_network="best-validation") and the validations since."""

    score: float = math.inf
    iteration: int = 0
    state: dict[str, torch.Tensor] | None = None
    bad: int = 0  # validations in a row without improvement (validation_patience counts them)

    def saved(self) -> dict[str, Any]:
        """As a checkpoint keeps it: a plain dict (what weights_only loading reads)."""
        return {"score": self.score, "iteration": self.iteration, "state": self.state, "bad": self.bad}

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> Best:
        """From a checkpoint's dict; one from before the objective kept the validation loss as "loss"."""
        score = saved.get("score", saved.get("loss", math.inf))
        return cls(score=score, iteration=saved["iteration"], state=saved.get("state"), bad=saved["bad"])


def best_updated(best: Best, score: float, iteration: int, model: nn.Module, rule: ValidationRule) -> bool:
    """Count a validation's `score` (lower is better) against the best so far; True when it is the new best
    (kept as the output network under output_network="best-validation"), else one more validation without."""
    if not score < best.score:  # NaN (no value) is never better
        best.bad += 1
        return False
    best.score, best.iteration, best.bad = score, iteration, 0
    if rule.output_network == "best-validation":
        best.state = cpu_copy(model.state_dict())
    return True


def objective_nan(objective: Objective, metrics: dict[str, float | None], iteration: int) -> str | None:
    """The stop reason when the objective metric's validation value is NaN (a metric that divides by zero, say):
    its patience would count it as no improvement and stop as if the criterion were met."""
    value = metrics.get(objective.name)
    if objective.name == "loss" or value is None or not math.isnan(value):
        return None
    return (
        f"Stopped: objective_metric={objective.name!r} was NaN at the validation of iteration {iteration}; make the "
        "metric return a number for every validation set, or pick another objective_metric"
    )


def patience_met(rule: ValidationRule, objective: Objective) -> str:
    """The stop reason once validation_patience validations in a row did not improve the objective."""
    if objective.name == "loss":
        return f"Met validation criterion (validation_patience={rule.patience})"
    return f"Met validation criterion (validation_patience={rule.patience}, objective_metric={objective.name!r})"


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}
