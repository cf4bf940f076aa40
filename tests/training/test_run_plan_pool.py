"""The run plan on a real 2-worker CPU pool (gloo): step_fn validates on every rank, ReduceLROnPlateau is stepped
with the objective metric, and a refusal comes from the notebook before any worker trains."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbscale
from nbscale import OptionsError
from tests.training.digits import tiny_net
from tests.training.run_plan_helpers import (
    SMALL,
    VAL,
    assert_trained_as_the_plain_loop,
    assert_validation_is_the_networks,
    linear_head,
    mixup,
    options,
    plain_loop,
    plain_sgd,
    plateau,
    regression,
    replayed_rates,
)

pytestmark = pytest.mark.slow


def test_step_fn_validation_on_the_pool_is_the_steps_loss_and_metrics(pool: nbscale.Pool) -> None:
    fields = {"validation_data": VAL, "validation_frequency": 100, "execution_environment": "parallel"}
    net, info = nbscale.train(tiny_net(), SMALL, options(**fields), step_fn=mixup)
    assert "2 workers" in info.hardware
    assert_validation_is_the_networks(net, info)


def test_plateau_on_the_pool_is_stepped_with_the_objective_metric(pool: nbscale.Pool) -> None:
    _, info = nbscale.train(
        tiny_net(),
        SMALL,
        options(
            max_epochs=4,
            validation_data=VAL,
            validation_frequency=2,
            objective_metric="accuracy",
            learn_rate_schedule=plateau("max"),
            execution_environment="parallel",
        ),
    )
    assert "2 workers" in info.hardware
    assert info.learn_rate == pytest.approx(replayed_rates(info.validation_metrics["accuracy"], "max"))
    assert min(info.learn_rate) < 0.1  # it was stepped


def test_a_refusal_on_the_pool_comes_before_training(pool: nbscale.Pool) -> None:
    network = nn.Sequential(*tiny_net(), nn.Softmax(dim=1))
    with pytest.raises(OptionsError, match=r"^The network's last layer '3' is nn.Softmax"):
        nbscale.train(network, SMALL, options(execution_environment="parallel"))


def test_train_async_reads_the_plan_of_a_regression_on_1d_targets(pool: nbscale.Pool) -> None:
    data = regression()
    fields = {"solver": plain_sgd, "shuffle": "never", "mini_batch_size": 32, "max_epochs": 3, "loss": "mse"}
    net, info = nbscale.train_async(linear_head(), data, options(**fields), pool=pool).result(timeout=300)
    reference = linear_head()
    assert_trained_as_the_plain_loop(net, info, reference, plain_loop(reference, data, F.mse_loss, 3))


def broken_solver(params: list[dict], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr)  # takes two arguments: nbscale gives one


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"solver": broken_solver}, r"^solver=broken_solver failed on the parameter groups"),
        (
            {"learn_rate_schedule": plateau("max"), "validation_data": VAL},
            r"^learn_rate_schedule returned ReduceLROnPlateau\(mode='max'\)",
        ),
        ({"on_worker_failure": "restart"}, r"^on_worker_failure='restart' resumes from the last checkpoint"),
        ({"metrics": ("rmse",)}, r"rmse"),
    ],
)
def test_the_plans_refusals_on_the_pool_come_from_the_notebook_as_options_errors(
    pool: nbscale.Pool, fields: dict, said: str
) -> None:
    with pytest.raises(OptionsError, match=said):
        nbscale.train(tiny_net(), SMALL, options(execution_environment="parallel", **fields))


def test_a_train_async_runs_output_fn_on_its_worker_beside_its_info(pool: nbscale.Pool) -> None:
    def stop_at_three(info: nbscale.TrainingInfo) -> bool:
        return info.iteration[-1] >= 3 if info.iteration else False

    run = nbscale.train_async(tiny_net(), SMALL, options(output_fn=stop_at_three), pool=pool)
    _, info = run.result(timeout=300)
    assert info.stop_reason == "Stopped by output_fn" and info.iteration[-1] == 3


def test_train_async_leaves_worker_load_and_on_worker_failure_out_as_documented(pool: nbscale.Pool) -> None:
    fields = {"worker_load": [3, 1], "on_worker_failure": "restart", "max_epochs": 1}  # the pool's, not one worker's
    _, info = nbscale.train_async(tiny_net(), SMALL, options(**fields), pool=pool).result(timeout=300)
    assert info.stop_reason == "Max epochs completed" and info.mini_batch_size == 64
