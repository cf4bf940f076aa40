"""The validation figures in `info` are those of the network `train` returns, on every path.

On a pool each worker's BatchNorm running statistics follow its own share of the data; the figures reported
must still be what evaluating the returned network on the validation data gives.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import nbscale
from tests.training.digits import digits

TRAIN, VAL = digits()

pytestmark = pytest.mark.slow


def batch_norm_net() -> nn.Module:
    torch.manual_seed(0)
    # momentum 0.5: the running statistics follow each worker's last batches closely, so workers differ clearly
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32, momentum=0.5), nn.ReLU(), nn.Linear(32, 10))


def train_with_validation(environment: str, output_network: str) -> tuple[nn.Module, nbscale.TrainingInfo]:
    torch.manual_seed(1)
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=1.0,
        mini_batch_size=60,
        max_epochs=3,
        validation_data=VAL,
        validation_frequency=7,
        output_network=output_network,
        execution_environment=environment,
        verbose=False,
    )
    return nbscale.train(batch_norm_net(), TRAIN, options)


def evaluated(net: nn.Module) -> tuple[float, float]:
    """(loss, accuracy) of `net` on the validation data, as a user measures them."""
    loss = torch.nn.functional.cross_entropy(nbscale.predict(net, VAL), VAL[1]).item()
    return loss, nbscale.accuracy(net, VAL)


def assert_figures_are_the_returned_networks(net: nn.Module, info: nbscale.TrainingInfo) -> None:
    loss, accuracy = evaluated(net)
    assert info.final_validation_accuracy == accuracy
    assert info.final_validation_loss == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("workers", [2, 3])
def test_a_pools_final_validation_figures_are_the_returned_networks(workers: int) -> None:
    with nbscale.Pool(workers, cpu=True):
        for output_network in ("last-iteration", "best-validation"):
            net, info = train_with_validation("parallel", output_network)
            assert f"{workers} workers" in info.hardware
            assert_figures_are_the_returned_networks(net, info)
            if output_network == "best-validation":
                # the best network is an earlier one here, so the figures are not simply the last computed
                assert info.output_network_iteration < info.iteration[-1]
                at = info.iteration.index(info.output_network_iteration)
                assert info.final_validation_loss == info.validation_loss[at]


def test_in_the_notebooks_process_the_final_validation_figures_are_the_returned_networks() -> None:
    for output_network in ("last-iteration", "best-validation"):
        net, info = train_with_validation("cpu", output_network)
        assert_figures_are_the_returned_networks(net, info)


def stopped_by_output_fn_at_iteration_8(environment: str) -> tuple[nn.Module, nbscale.TrainingInfo]:
    torch.manual_seed(1)
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=1.0,
        mini_batch_size=60,
        max_epochs=3,
        validation_data=VAL,
        validation_frequency=7,
        execution_environment=environment,
        verbose=True,
        output_fn=lambda info: info.iteration[-1] >= 8,
    )
    return nbscale.train(batch_norm_net(), TRAIN, options)


@pytest.mark.parametrize("environment", ["cpu", "parallel"])
def test_a_run_output_fn_stops_between_validations_validates_the_network_it_returns(environment: str, capsys) -> None:
    """output_fn sees iteration 8 (not a validation iteration) and stops: the run validates that network."""
    with nbscale.Pool(2, cpu=True) if environment == "parallel" else contextlib.nullcontext():
        net, info = stopped_by_output_fn_at_iteration_8(environment)
    assert info.iteration[-1] == 8 and info.stop_reason == "Stopped by output_fn"
    assert_figures_are_the_returned_networks(net, info)
    assert info.validation_accuracy[-1] == info.final_validation_accuracy  # in the history at the stop, too
    last_row = capsys.readouterr().out.splitlines()[-3]  # the row of iteration 8, above the rule and the reason
    assert last_row.split("|")[2].strip() == "8" and f"{100 * info.final_validation_accuracy:.2f}%" in last_row


def test_the_info_panel_ends_with_the_returned_networks_validation_figures(kernel) -> None:
    assert kernel.run("""
import nbscale, torch
from tests.training.test_validation_figures import TRAIN, VAL, batch_norm_net
pool = nbscale.Pool(2, cpu=True)
torch.manual_seed(1)
opts = nbscale.TrainingOptions("sgdm", initial_learn_rate=1.0, mini_batch_size=60, max_epochs=3, validation_data=VAL,
                               validation_frequency=7, output_network="best-validation",
                               execution_environment="parallel", verbose=False, plots="training-progress")
""").ok
    result = kernel.run("net, info = nbscale.train(batch_norm_net(), TRAIN, opts)")
    assert result.ok, result.text
    figures = kernel.run(
        "print(info.final_validation_loss, info.final_validation_accuracy, "
        "info.output_network_iteration, nbscale.accuracy(net, VAL))"
    ).stdout.split()
    loss, accuracy, iteration, returned_accuracy = (
        float(figures[0]),
        float(figures[1]),
        int(figures[2]),
        float(figures[3]),
    )
    assert accuracy == returned_accuracy
    panel = [d["text/plain"] for d in result.displays if d.get("text/plain", "").startswith("State:")][-1]
    assert (
        f"Validation: loss {loss:.4f}, accuracy {100 * accuracy:.2f}% (the returned network, iteration {iteration})"
    ) in panel
