"""Gradient clipping (MATLAB's gradient_threshold and gradient_threshold_method)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from nbscale.training.solver import SolverRule


def clipping(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, solver: SolverRule
) -> Callable[[], None]:
    """The gradient clipping of every iteration (MATLAB's gradient_threshold), or a function doing nothing."""
    threshold, method = solver.gradient_threshold, solver.gradient_threshold_method
    if math.isinf(threshold):
        return _no_clipping

    def clip() -> None:
        scaler.unscale_(optimizer)  # clip the true gradients (does nothing without loss scaling)
        clip_gradients(model, method, threshold)

    return clip


def _no_clipping() -> None:
    pass


def clip_gradients(model: nn.Module, method: str, threshold: float) -> None:
    """MATLAB's gradient clipping: per-parameter L2 norm, global L2 norm, or element-wise absolute value."""
    with_gradients = [p for p in model.parameters() if p.grad is not None]
    if not with_gradients:
        return
    if method == "global-l2norm":
        torch.nn.utils.clip_grad_norm_(with_gradients, threshold)
    elif method == "absolute-value":
        torch.nn.utils.clip_grad_value_(with_gradients, threshold)
    else:  # "l2norm": each parameter's gradient on its own (torch has no public per-tensor clip in one launch)
        grads = [p.grad for p in with_gradients if p.grad is not None]  # all are; this narrows the type
        norms = torch._foreach_norm(grads)
        factors = [torch.clamp(threshold / (n + 1e-12), max=1.0) for n in norms]
        torch._foreach_mul_(grads, factors)
