"""Bring your own PyTorch pieces, trained in this process: loss names and functions, step_fn, a model with several
outputs, solver and learn-rate schedule factories, their checkpoints, and the errors of bad ones."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import nbscale
from nbscale import OptionsError, TrainingOptions
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()
SMALL = (TRAIN[0][:512], TRAIN[1][:512])


def options(**fields: Any) -> TrainingOptions:
    base = {"solver": "sgdm", "initial_learn_rate": 0.1, "max_epochs": 2, "mini_batch_size": 64, "verbose": False}
    return TrainingOptions(**{**base, **fields})


def weights(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> bool:
    return all(torch.allclose(p, q, atol=atol) for p, q in zip(a, b, strict=True))


# ---- losses ------------------------------------------------------------------------------------------------------


def test_loss_crossentropy_by_name_or_function_trains_as_the_default() -> None:
    default, _ = nbscale.train(tiny_net(), SMALL, options())
    named, _ = nbscale.train(tiny_net(), SMALL, options(loss="crossentropy"))
    function, _ = nbscale.train(tiny_net(), SMALL, options(loss=lambda o, t: nn.functional.cross_entropy(o, t)))
    assert same(weights(default), weights(named)) and same(weights(default), weights(function))


@pytest.mark.parametrize("name", ["mse", "l1"])
def test_regression_loss_names_fit_float_targets(name: str) -> None:
    inputs = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5]])
    torch.manual_seed(0)
    _, info = nbscale.train(nn.Linear(3, 1), (inputs, targets), options(loss=name, max_epochs=20, mini_batch_size=32))
    assert info.training_loss[-1] < 0.1 * info.training_loss[0]


def test_binary_crossentropy_takes_zero_one_targets_of_one_score() -> None:
    inputs = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    targets = (inputs[:, 0] > 0).float()[:, None]
    torch.manual_seed(0)
    _, info = nbscale.train(
        nn.Linear(2, 1),
        (inputs, targets),
        options(loss="binary-crossentropy", max_epochs=10, mini_batch_size=32, initial_learn_rate=1),
    )
    assert info.training_loss[-1] < 0.5 * info.training_loss[0]


def test_unknown_loss_name_is_an_options_error_with_the_closest_name() -> None:
    with pytest.raises(OptionsError, match=r"loss='crossentropi'.*did you mean 'crossentropy'"):
        TrainingOptions(loss="crossentropi")


# ---- step_fn and several outputs ---------------------------------------------------------------------------------


def test_step_fn_mixup_sees_every_batch_and_trains_on_the_mixed_inputs() -> None:
    seen: list[torch.Tensor] = []

    def mixup(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(inputs)
        mixed = 0.8 * inputs + 0.2 * inputs.roll(1, 0)
        outputs = model(mixed)
        loss = 0.8 * nn.functional.cross_entropy(outputs, targets) + 0.2 * nn.functional.cross_entropy(
            outputs, targets.roll(1, 0)
        )
        return loss, outputs

    net, info = nbscale.train(tiny_net(), TRAIN, options(max_epochs=3), step_fn=mixup)
    assert len(seen) == len(info.iteration) == 3 * (1500 // 64)
    assert all(batch.shape == (64, 64) for batch in seen)
    assert info.training_accuracy[-1] > 0.8  # the outputs step_fn returned: their accuracy is reported
    assert (net(VAL[0]).argmax(1) == VAL[1]).float().mean() > 0.8


def test_step_fn_returning_the_loss_alone_trains_without_training_accuracy() -> None:
    def step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(inputs), targets)

    alone, info = nbscale.train(tiny_net(), SMALL, options(), step_fn=step)
    default, _ = nbscale.train(tiny_net(), SMALL, options())
    assert same(weights(alone), weights(default))
    assert all(a is None or math.isnan(a) for a in info.training_accuracy)


def test_step_fn_returning_a_per_sample_loss_is_an_options_error() -> None:
    def step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(inputs), targets, reduction="none")

    with pytest.raises(OptionsError, match=r"step_fn must return.*shape \(64,\).*mean"):
        nbscale.train(tiny_net(), SMALL, options(), step_fn=step)


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_net()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.net(x)
        return scores, scores.softmax(1)


def test_model_with_several_outputs_trains_on_its_first_output() -> None:
    two, _ = nbscale.train(TwoOutputs(), SMALL, options())
    one, _ = nbscale.train(tiny_net(), SMALL, options())
    assert same(weights(two), weights(one))


# ---- solver and schedule factories -------------------------------------------------------------------------------


def adamw(params: list[dict[str, Any]]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), weight_decay=0.05)


def one_cycle(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=4 * (512 // 64))


def test_adamw_factory_with_onecycle_steps_the_rate_each_iteration() -> None:
    given: list[Any] = []

    def solver(params: list[dict[str, Any]]) -> torch.optim.Optimizer:
        given.extend(params)
        return adamw(params)

    _, info = nbscale.train(tiny_net(), SMALL, options(solver=solver, learn_rate_schedule=one_cycle, max_epochs=4))
    assert given and all(group["lr_factor"] == 1.0 for group in given)
    reference = one_cycle(adamw([{"params": [nn.Parameter(torch.zeros(1))], "lr_factor": 1.0}]))
    expected = []
    for _ in range(4 * (512 // 64)):
        expected.append(reference.get_last_lr()[0])
        reference.optimizer.step()
        reference.step()
    assert info.learn_rate == pytest.approx(expected)
    assert "adamw" not in repr(options(solver=solver)) and "'custom'" in repr(options(solver=solver))


def test_custom_solver_keeps_learn_rate_factors_as_groups_of_its_rate() -> None:
    from nbscale.models.learn_rates import set_learn_rate_factor

    net = tiny_net()
    set_learn_rate_factor(net, "0", 0.5)
    seen: list[torch.optim.Optimizer] = []

    def solver(params: list[dict[str, Any]]) -> torch.optim.Optimizer:
        seen.append(torch.optim.SGD(params, lr=0.2))
        return seen[-1]

    nbscale.train(net, SMALL, options(solver=solver, max_epochs=1))
    assert sorted(group["lr"] for group in seen[-1].param_groups) == pytest.approx([0.1, 0.2])


def test_steplr_stepped_per_epoch() -> None:
    _, info = nbscale.train(
        tiny_net(),
        SMALL,
        options(
            max_epochs=3,
            learn_rate_schedule_step="epoch",
            learn_rate_schedule=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
        ),
    )
    per_epoch = 512 // 64
    assert info.learn_rate == pytest.approx([0.1] * per_epoch + [0.05] * per_epoch + [0.025] * per_epoch)


def test_reduce_on_plateau_lowers_the_rate_after_validations_that_do_not_improve() -> None:
    # a threshold no validation loss can beat (99% lower): each validation after the first lowers the rate
    _, info = nbscale.train(
        tiny_net(),
        SMALL,
        options(
            max_epochs=2,
            validation_data=VAL,
            validation_frequency=4,
            learn_rate_schedule=lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=0.5, patience=0, threshold=0.99
            ),
        ),
    )
    validated = [
        i
        for i, loss in zip(info.iteration, info.validation_loss, strict=True)
        if loss is not None and not math.isnan(loss)
    ]
    rates = info.learn_rate
    drops = [info.iteration[k] for k in range(1, len(rates)) if rates[k] < rates[k - 1]]
    assert (
        drops
        and all(i - 1 in validated for i in drops)
        and len(drops) == len(validated) - 1 - (info.iteration[-1] in validated)
    )
    assert info.learn_rate[-1] == pytest.approx(0.1 * 0.5 ** len(drops))


def test_checkpoint_and_resume_equal_an_uninterrupted_run_with_factories(tmp_path: Any) -> None:
    fields = {"solver": adamw, "learn_rate_schedule": one_cycle}
    whole, whole_info = nbscale.train(tiny_net(), SMALL, options(max_epochs=4, **fields))
    nbscale.train(tiny_net(), SMALL, options(max_epochs=2, checkpoint_path=str(tmp_path), **fields))
    resumed, info = nbscale.train(tiny_net(), SMALL, options(max_epochs=4, **fields), resume_from=str(tmp_path))
    assert same(weights(whole), weights(resumed), atol=0)
    assert info.learn_rate == whole_info.learn_rate


# ---- errors before training --------------------------------------------------------------------------------------


def test_solver_factory_returning_no_optimizer_fails_before_training() -> None:
    started: list[Any] = []
    with pytest.raises(OptionsError, match=r"solver=<lambda> returned int, not a torch.optim.Optimizer.*lambda params"):
        nbscale.train(tiny_net(), SMALL, options(solver=lambda params: 3, output_fn=started.append))
    assert started == []


def test_schedule_factory_needing_more_arguments_fails_before_training() -> None:
    with pytest.raises(OptionsError, match=r"learn_rate_schedule=StepLR failed.*step_size.*lambda optimizer"):
        nbscale.train(tiny_net(), SMALL, options(learn_rate_schedule=torch.optim.lr_scheduler.StepLR))


@pytest.mark.parametrize(
    ("name", "pointer"),
    [
        ("lr", "initial_learn_rate"),
        ("weight_decay", "l2_regularization"),
        ("label_smoothing", "CrossEntropyLoss"),
        ("patience", "validation_patience"),
        ("epochs", "max_epochs"),
        ("batch_size", "mini_batch_size"),
        ("optimizer", "solver="),
        ("scheduler", "learn_rate_schedule="),
        ("clip_grad_norm", "gradient_threshold"),
    ],
)
def test_pytorch_names_point_to_the_nbscale_field(name: str, pointer: str) -> None:
    with pytest.raises(OptionsError) as raised:
        TrainingOptions(**{name: 1})
    assert pointer in str(raised.value) and "The fields are" not in str(raised.value)


# ---- loss_fn by name ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mse", "l1", "binary-crossentropy"])
def test_loss_fn_by_name_trains_as_options_loss_of_that_name(name: str) -> None:
    inputs = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5]])
    if name == "binary-crossentropy":
        targets = (targets > 0).float()
    runs = []
    for loss_fn, loss in ((name, None), (None, name)):
        torch.manual_seed(0)
        net, info = nbscale.train(nn.Linear(3, 1), (inputs, targets), options(loss=loss), loss_fn=loss_fn)
        runs.append((weights(net), info))
    (by_argument, argument_info), (by_option, option_info) = runs
    assert same(by_argument, by_option)
    assert argument_info.training_loss == option_info.training_loss
    assert argument_info.metric_names == option_info.metric_names


def test_loss_fn_crossentropy_by_name_trains_as_the_default() -> None:
    default, _ = nbscale.train(tiny_net(), SMALL, options())
    named, info = nbscale.train(tiny_net(), SMALL, options(), loss_fn="crossentropy")
    assert same(weights(default), weights(named))
    assert info.metric_names == ("accuracy",)
