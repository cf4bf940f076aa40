"""What the run plan's tests share, in this process and on a pool (tests/training/test_run_plan.py and
test_run_plan_pool.py): the data, the options, PyTorch's own loop and scheduler to check against, a mixup step_fn,
and the checks of a trained network against plain PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbscale import TrainingOptions
from tests.training.digits import digits

TRAIN, VAL = digits()
SMALL = (TRAIN[0][:512], TRAIN[1][:512])


def options(**fields: Any) -> TrainingOptions:
    base = {"solver": "sgdm", "initial_learn_rate": 0.1, "max_epochs": 2, "mini_batch_size": 64, "verbose": False}
    return TrainingOptions(**{**base, **fields})


def plain_sgd(params: list[dict[str, Any]]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def regression(samples: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs N x 4 and 1-D targets (N,), as a table's column gives them."""
    inputs = torch.randn(samples, 4, generator=torch.Generator().manual_seed(1))
    return inputs, inputs @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1


def linear_head(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))  # outputs N x 1


def plain_loop(
    model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable[..., torch.Tensor], epochs: int
) -> list[float]:
    """PyTorch's own loop over the data in order, batches of 32, with (N, 1) targets: the losses it saw."""
    optimizer = plain_sgd([{"params": list(model.parameters())}])
    inputs, targets = data[0], data[1][:, None]
    losses = []
    for _ in range(epochs):
        for start in range(0, len(inputs), 32):
            loss = loss_fn(model(inputs[start : start + 32]), targets[start : start + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def assert_trained_as_the_plain_loop(net: nn.Module, info: Any, reference: nn.Module, expected: list[float]) -> None:
    """nbscale's losses are `expected` (plain_loop's, which trained `reference`), and `net` ended as `reference`."""
    assert info.training_loss == pytest.approx(expected, abs=1e-5)
    for mine, theirs in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)


def mixup(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, training: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup that switches itself off in validation (module-level: it travels to the workers)."""
    if not training:
        outputs = model(inputs)
        return F.cross_entropy(outputs, targets), outputs
    outputs = model(0.8 * inputs + 0.2 * inputs.roll(1, 0))
    return 0.8 * F.cross_entropy(outputs, targets) + 0.2 * F.cross_entropy(outputs, targets.roll(1, 0)), outputs


def assert_validation_is_the_networks(net: nn.Module, info: Any) -> None:
    """The final validation loss and accuracy are PyTorch's own figures of the returned network on VAL."""
    with torch.no_grad():
        outputs = net.eval()(VAL[0])
    assert info.final_validation_loss == pytest.approx(F.cross_entropy(outputs, VAL[1]).item(), abs=1e-5)
    expected_accuracy = (outputs.argmax(1) == VAL[1]).float().mean().item()
    assert info.final_validation_accuracy == pytest.approx(expected_accuracy, abs=1e-6)


def plateau(mode: str) -> Callable[[torch.optim.Optimizer], Any]:
    return lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode, factor=0.5, patience=0)


def replayed_rates(values: list[float | None], mode: str) -> list[float]:
    """The rate of each iteration that torch's own ReduceLROnPlateau gives, stepped with `values` after the
    iterations that validated (None: no validation)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = plateau(mode)(optimizer)
    rates = []
    for value in values:
        rates.append(optimizer.param_groups[0]["lr"])
        if value is not None:
            scheduler.step(value)
    return rates
