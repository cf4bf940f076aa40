"""The run plan's PyTorch-semantics rules, trained in this process and checked against plain PyTorch written here:
regression targets shaped as the outputs, step_fn in validation, ReduceLROnPlateau stepped with the objective, and
the refusals and warnings of what the network would apply twice."""

from __future__ import annotations

import math
import pickle
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbscale
from nbscale import OptionsError
from nbscale.models.normalization import with_normalization
from nbscale.training.losses import matched_targets
from nbscale.training.trainer import checked_inputs
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

# ---- regression losses: targets shaped as the outputs ------------------------------------------------------------


@pytest.mark.parametrize(
    "loss",
    ["mse", "l1", nn.MSELoss(), nn.SmoothL1Loss(), F.huber_loss],
    ids=["mse", "l1", "MSELoss", "smooth", "huber"],
)
def test_regression_loss_on_n_by_1_outputs_and_1d_targets_trains_as_pytorch_with_n_by_1_targets(loss: Any) -> None:
    data = regression()
    fields = {"solver": plain_sgd, "shuffle": "never", "mini_batch_size": 32, "max_epochs": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's broadcasting UserWarning would fail the test
        net, info = nbscale.train(linear_head(), data, options(**fields), loss_fn=loss)
    reference = linear_head()
    named = {"mse": F.mse_loss, "l1": F.l1_loss}
    expected = plain_loop(reference, data, named.get(loss, loss) if isinstance(loss, str) else loss, 3)
    assert_trained_as_the_plain_loop(net, info, reference, expected)
    assert info.training_loss[-1] < 0.5 * info.training_loss[0]  # it learned (an N x N loss would not)


def test_n_by_1_targets_of_a_1d_output_are_viewed_as_the_outputs() -> None:
    inputs, targets = regression()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))  # outputs (N,)
    _, info = nbscale.train(net, (inputs, targets[:, None]), options(loss="mse", max_epochs=1, initial_learn_rate=0.01))
    assert len(info.training_loss) == 4


@pytest.mark.parametrize(
    ("outputs", "targets", "shown"),
    [
        (3, (), r"outputs are \(N, 3\) and the targets \(N,\)"),
        (2, (3,), r"outputs are \(N, 2\) and the targets \(N, 3\)"),
    ],
)
def test_regression_shapes_that_do_not_match_unambiguously_are_refused_naming_the_loss_and_shapes(
    outputs: int, targets: tuple[int, ...], shown: str
) -> None:
    inputs = torch.randn(64, 4)
    with pytest.raises(OptionsError, match=rf"^loss='mse' compares .*{shown}.*give targets of shape"):
        nbscale.train(nn.Linear(4, outputs), (inputs, torch.randn(64, *targets)), options(loss="mse"))
    with pytest.raises(OptionsError, match=rf"^loss_fn=nn.L1Loss\(\) compares .*{shown}"):
        nbscale.train(nn.Linear(4, outputs), (inputs, torch.randn(64, *targets)), options(), loss_fn=nn.L1Loss())


def test_the_validation_targets_are_checked_before_training_too() -> None:
    inputs, targets = regression()
    with pytest.raises(OptionsError, match=r"targets \(N, 2\)"):
        nbscale.train(
            linear_head(),
            (inputs, targets),
            options(loss="mse", validation_data=(inputs[:8], torch.randn(8, 2))),
        )


@pytest.mark.parametrize(
    ("outputs", "targets", "viewed"),
    [((5, 1), (5,), (5, 1)), ((5,), (5, 1), (5,)), ((5, 3), (5, 1, 3), (5, 3)), ((5, 3), (5, 3), (5, 3))],
)
def test_targets_are_viewed_as_the_outputs_where_only_sizes_of_1_differ(
    outputs: tuple[int, ...], targets: tuple[int, ...], viewed: tuple[int, ...]
) -> None:
    matched = matched_targets(torch.zeros(outputs), torch.arange(5 * 3 * 1.0)[: math.prod(targets)].view(targets))
    assert matched is not None and matched.shape == viewed


@pytest.mark.parametrize(("outputs", "targets"), [((5, 3), (5,)), ((5, 1), (4,)), ((5, 2, 3), (5, 3, 2))])
def test_other_shapes_have_no_match(outputs: tuple[int, ...], targets: tuple[int, ...]) -> None:
    assert matched_targets(torch.zeros(outputs), torch.zeros(targets)) is None


def test_a_loss_function_of_your_own_gets_the_targets_as_they_are() -> None:
    shapes: list[tuple[int, ...]] = []

    def own(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(targets.shape))
        return F.mse_loss(outputs[:, 0], targets)

    nbscale.train(linear_head(), regression(), options(max_epochs=1, mini_batch_size=64), loss_fn=own)
    assert set(shapes) == {(64,)}


# ---- step_fn in validation ---------------------------------------------------------------------------------------


def test_step_fn_gives_the_validation_loss_called_under_eval_and_no_grad() -> None:
    calls: list[tuple[bool, bool]] = []

    def reconstruct(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls.append((model.training, torch.is_grad_enabled()))
        return F.mse_loss(model(inputs), inputs)

    torch.manual_seed(0)
    autoencoder = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64))
    net, info = nbscale.train(
        autoencoder, SMALL, options(validation_data=VAL, validation_frequency=100), step_fn=reconstruct
    )
    with torch.no_grad():
        expected = F.mse_loss(net.eval()(VAL[0]), VAL[0]).item()  # PyTorch's reconstruction error
    assert info.final_validation_loss == pytest.approx(expected, abs=1e-5)
    assert expected < 0.5  # a cross-entropy of the outputs against the labels would be several units
    assert (True, True) in calls and (False, False) in calls


def test_step_fn_taking_training_is_told_which_and_its_outputs_give_the_validation_metrics() -> None:
    told: list[bool] = []

    def told_mixup(
        model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, training: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        told.append(training)
        return mixup(model, inputs, targets, training)  # switches itself off in validation

    fields = {"validation_data": VAL, "validation_frequency": 100}
    net, info = nbscale.train(tiny_net(), SMALL, options(**fields), step_fn=told_mixup)
    assert_validation_is_the_networks(net, info)
    assert told.count(True) == 16 and told.count(False) >= 2  # 2 epochs of 8 batches; validations of 297 samples


# ---- ReduceLROnPlateau -------------------------------------------------------------------------------------------


def test_plateau_in_max_mode_is_stepped_with_the_objective_metric() -> None:
    _, info = nbscale.train(
        tiny_net(),
        SMALL,
        options(
            max_epochs=4,
            validation_data=VAL,
            validation_frequency=2,
            objective_metric="accuracy",
            learn_rate_schedule=plateau("max"),
        ),
    )
    accuracies = info.validation_metrics["accuracy"]
    assert info.learn_rate == pytest.approx(replayed_rates(accuracies, "max"))
    rates = info.learn_rate
    assert rates[-1] < 0.1 and rates[-1] > 0.1 * 0.5 ** (sum(a is not None for a in accuracies) - 1)  # some rose


def test_plateau_without_objective_metric_is_stepped_with_the_validation_loss() -> None:
    _, info = nbscale.train(
        tiny_net(),
        SMALL,
        options(max_epochs=4, validation_data=VAL, validation_frequency=2, learn_rate_schedule=plateau("min")),
    )
    assert info.learn_rate == pytest.approx(replayed_rates(info.validation_loss, "min"))


@pytest.mark.parametrize(
    ("mode", "objective", "said"),
    [
        ("min", "accuracy", r"mode='min'\), which nbscale steps with objective_metric='accuracy', better high"),
        ("max", "loss", r"mode='max'\), which nbscale steps with the validation loss, better low"),
    ],
)
def test_a_plateau_mode_against_the_objective_is_refused_before_training(mode: str, objective: str, said: str) -> None:
    fields = {"validation_data": VAL, "objective_metric": objective, "learn_rate_schedule": plateau(mode)}
    with pytest.raises(OptionsError, match=rf"^learn_rate_schedule returned ReduceLROnPlateau\({said}"):
        nbscale.train(tiny_net(), SMALL, options(**fields))


def test_a_plateau_without_validation_data_is_refused() -> None:
    with pytest.raises(OptionsError, match="no validation_data: give validation_data"):
        nbscale.train(tiny_net(), SMALL, options(learn_rate_schedule=plateau("min")))


# ---- what the network would apply twice --------------------------------------------------------------------------


class EndsInSoftmax(nn.Module):
    """A network whose softmax is registered first but applied last: only a forward pass shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.probabilities = nn.Softmax(dim=1)
        self.body = tiny_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.probabilities(self.body(x))


@pytest.mark.parametrize(
    ("network", "named"),
    [
        (lambda: nn.Sequential(*tiny_net(), nn.Softmax(dim=1)), r"last layer '3' is nn.Softmax\(dim=1\)"),
        (lambda: nn.Sequential(tiny_net(), nn.Sequential(nn.Softmax(dim=1))), r"last layer '1.0' is nn.Softmax"),
        (EndsInSoftmax, r"last layer 'probabilities' is nn.Softmax"),
    ],
    ids=["sequential", "nested", "custom"],
)
def test_a_last_softmax_under_cross_entropy_is_refused_naming_the_layer(
    network: Callable[[], nn.Module], named: str
) -> None:
    with pytest.raises(OptionsError, match=rf"^The network's {named}.*applies its own softmax.*remove that layer"):
        nbscale.train(network(), SMALL, options())


def test_a_last_log_softmax_is_refused_naming_nll_loss_and_trains_with_it() -> None:
    network = nn.Sequential(*tiny_net(), nn.LogSoftmax(dim=1))
    with pytest.raises(OptionsError, match=r"nn.LogSoftmax.*loss_fn=nn.NLLLoss\(\)"):
        nbscale.train(network, SMALL, options(), loss_fn=nn.CrossEntropyLoss())
    _, info = nbscale.train(network, SMALL, options(max_epochs=1), loss_fn=nn.NLLLoss())
    assert len(info.training_loss) == 8


def test_a_last_sigmoid_under_binary_cross_entropy_on_logits_is_refused() -> None:
    inputs = torch.randn(64, 2)
    with pytest.raises(OptionsError, match=r"nn.Sigmoid\(\).*binary cross-entropy on logits.*nn.BCELoss\(\)"):
        nbscale.train(
            nn.Sequential(nn.Linear(2, 1), nn.Sigmoid()),
            (inputs, (inputs[:, :1] > 0).float()),
            options(loss="binary-crossentropy"),
        )


def test_a_softmax_inside_the_network_is_not_refused() -> None:
    torch.manual_seed(0)
    attention_like = nn.Sequential(nn.Linear(64, 64), nn.Softmax(dim=1), nn.Linear(64, 10))
    _, info = nbscale.train(attention_like, SMALL, options(max_epochs=1))
    assert len(info.training_loss) == 8


class SmallConvNet(nn.Module):
    """A torchvision-like network (not an nn.Sequential, which would run an added layer last)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=(2, 3)))


def normalizing_net() -> nn.Module:
    """What models.pretrained(..., normalize=True) builds, without downloading weights."""
    return with_normalization(SmallConvNet(), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def images(standardized: bool) -> tuple[torch.Tensor, torch.Tensor]:
    pixels = torch.rand(32, 3, 16, 16, generator=torch.Generator().manual_seed(0))  # in [0, 1]
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return ((pixels - mean) / std if standardized else pixels), torch.arange(32) % 2


def test_standardized_images_into_a_normalizing_network_warn_once_naming_normalize_false() -> None:
    with pytest.warns(UserWarning, match=r"already looks normalized.*models.pretrained\(\.\.\., normalize=False\)"):
        nbscale.train(normalizing_net(), images(standardized=True), options(max_epochs=1, mini_batch_size=16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbscale.train(normalizing_net(), images(standardized=False), options(max_epochs=1, mini_batch_size=16))


# ---- the plan itself ---------------------------------------------------------------------------------------------


def test_the_plan_is_frozen_and_pickles_with_its_rules() -> None:
    plan = checked_inputs(linear_head(), regression(), options(loss="mse"), None).plan
    copy = pickle.loads(pickle.dumps(plan))
    outputs, targets = torch.randn(5, 1), torch.randn(5)
    assert torch.equal(copy.loss_fn(outputs, targets), F.mse_loss(outputs, targets[:, None]))
    with pytest.raises(AttributeError):
        plan.solver = plan.solver  # type: ignore[misc]


class LockedLogger:
    """A logger that cannot be pickled (it holds a lock), as a live TensorBoard writer cannot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_plan_holds_every_choice_resolved_and_its_pickle_keeps_the_listeners_as_descriptions(tmp_path) -> None:
    run_options = options(
        solver="adam",
        l2_regularization=0.01,
        learn_rate_schedule="piecewise",
        learn_rate_drop_period=2,
        metrics=("accuracy", "fscore"),
        objective_metric="fscore",
        validation_data=(VAL[0][:64], VAL[1][:64]),
        checkpoint_path=str(tmp_path / "checkpoints"),
        precision="mixed",
        loggers=[LockedLogger()],
        output_fn=lambda info: False,
    )
    plan = checked_inputs(tiny_net(), SMALL, run_options, None).plan
    assert plan.metrics.names == ("accuracy", "fscore")
    assert (plan.objective.name, plan.objective.goal) == ("fscore", "maximize")
    assert (plan.solver.solver, plan.solver.learn_rate) == ("adam", 0.1)
    assert (plan.schedule.kind, plan.schedule.drop_period, plan.schedule.plateau_input) == ("piecewise", 2, None)
    assert (plan.batching.max_epochs, plan.batching.mini_batch_size) == (2, 64)
    assert (plan.placement.precision, plan.checkpoint.path) == ("mixed", str(tmp_path / "checkpoints"))
    assert plan.listeners.logger_names == ("LockedLogger",) and plan.listeners.output_fn is not None
    copy = pickle.loads(pickle.dumps(plan))  # a worker's copy: the live listeners stay in the notebook
    assert copy.listeners.loggers == () and copy.listeners.output_fn is None
    assert copy.listeners.logger_names == ("LockedLogger",)
    assert (copy.solver, copy.schedule, copy.batching, copy.placement) == (
        plan.solver,
        plan.schedule,
        plan.batching,
        plan.placement,
    )


def test_the_plans_optimizer_is_the_one_plain_pytorch_builds_with_no_l2_on_biases() -> None:
    model = tiny_net()
    plan = checked_inputs(model, SMALL, options(solver="adam", l2_regularization=0.01), None).plan
    made = pickle.loads(pickle.dumps(plan)).solver.make(model)
    weights = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    plain = torch.optim.Adam(
        [{"params": weights, "weight_decay": 0.01}, {"params": biases, "weight_decay": 0.0}], lr=0.1
    )
    for ours, theirs in zip(made.param_groups, plain.param_groups, strict=True):
        assert [id(p) for p in ours["params"]] == [id(p) for p in theirs["params"]]
        for key in ("lr", "betas", "eps", "weight_decay"):
            assert ours[key] == theirs[key]
