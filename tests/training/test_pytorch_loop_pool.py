"""Bring your own PyTorch pieces on a real 2-worker CPU pool (gloo): step_fn, factories, exact resume,
and train_async."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import nbscale
from tests.training.digits import tiny_net
from tests.training.test_pytorch_loop import SMALL, options, weights
from tests.training.test_pytorch_loop import same as same_within

pytestmark = pytest.mark.slow


def same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-5) -> bool:
    """Weights equal within `atol` (a pool sums gradients in another order than one process)."""
    return same_within(a, b, atol=atol)


def adamw(params: list[dict[str, Any]]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), weight_decay=0.05)


def one_cycle(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=4 * (512 // 64))


def scaled_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A step_fn whose result shows it ran: the loss doubled (SGD then moves twice as far)."""
    outputs = model(inputs)
    return 2 * nn.functional.cross_entropy(outputs, targets), outputs


def test_factories_on_the_pool_train_as_in_one_process(pool: nbscale.Pool) -> None:
    fields = {"solver": adamw, "learn_rate_schedule": one_cycle, "max_epochs": 4}
    alone, alone_info = nbscale.train(tiny_net(), SMALL, options(**fields))
    pooled, info = nbscale.train(tiny_net(), SMALL, options(execution_environment="parallel", **fields))
    assert "2 workers" in info.hardware and same(weights(alone), weights(pooled))
    assert info.learn_rate == pytest.approx(alone_info.learn_rate)


def test_step_fn_on_the_pool_replaces_the_loss(pool: nbscale.Pool) -> None:
    # without L2 (which the loss does not scale), SGD on twice the loss is SGD at twice the rate
    doubled, _ = nbscale.train(
        tiny_net(), SMALL, options(execution_environment="parallel", l2_regularization=0), step_fn=scaled_step
    )
    twice_the_rate, _ = nbscale.train(tiny_net(), SMALL, options(initial_learn_rate=0.2, l2_regularization=0))
    assert same(weights(doubled), weights(twice_the_rate))


def test_resume_on_the_pool_equals_an_uninterrupted_pool_run(pool: nbscale.Pool, tmp_path: Any) -> None:
    fields = {"solver": adamw, "learn_rate_schedule": one_cycle, "execution_environment": "parallel"}
    whole, whole_info = nbscale.train(tiny_net(), SMALL, options(max_epochs=4, **fields))
    nbscale.train(tiny_net(), SMALL, options(max_epochs=2, checkpoint_path=str(tmp_path), **fields))
    resumed, info = nbscale.train(tiny_net(), SMALL, options(max_epochs=4, **fields), resume_from=str(tmp_path))
    assert same(weights(whole), weights(resumed), atol=1e-6) and info.learn_rate == whole_info.learn_rate


def test_train_async_takes_step_fn_and_factories(pool: nbscale.Pool) -> None:
    # shuffle="never": the worker draws its own seed, so only an unshuffled order is the notebook's
    fields = {"solver": adamw, "learn_rate_schedule": one_cycle, "max_epochs": 4, "shuffle": "never"}
    alone, _ = nbscale.train(tiny_net(), SMALL, options(**fields), step_fn=scaled_step)
    run = nbscale.train_async(tiny_net(), SMALL, options(**fields), pool=pool, step_fn=scaled_step)
    net, info = run.result(timeout=300)
    assert same(weights(alone), weights(net)) and info.stop_reason == "Max epochs completed"
