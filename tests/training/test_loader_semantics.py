"""A DataLoader keeps its PyTorch meaning in nbscale.train (nbscale.data.loader_data, streaming):
its own sampler, an explicit option winning with one line, resume on the loader's generator, and a loader that
cannot be held resident. The row-by-row comparison with a plain loop is tests/reference."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, WeightedRandomSampler

import nbscale
from nbscale import TrainingOptions
from tests.reference.plain import accuracy, assert_same, classes, nbscale_history, network, plain_loop

DATA = classes()


def sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)  # type: ignore[arg-type]


def options(**fields: object) -> TrainingOptions:
    return TrainingOptions(**{"solver": sgd, "max_epochs": 2, "verbose": False, **fields})


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(3)


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: WeightedRandomSampler(torch.linspace(0.1, 1, len(DATA)), 30, generator=generator()),
        lambda: RandomSampler(DATA, num_samples=20, generator=generator()),
    ],
    ids=["WeightedRandomSampler", "RandomSampler(num_samples=20)"],
)
def test_a_dataloaders_own_sampler_is_followed_as_a_plain_loop_follows_it(sampler: object) -> None:
    plain = network()
    expected = plain_loop(plain, DataLoader(DATA, 8, sampler=sampler()), 2, sgd(plain.parameters()))  # type: ignore[operator]
    net, info = nbscale.train(network(), DataLoader(DATA, 8, sampler=sampler()), options())  # type: ignore[operator]
    assert info.iterations_per_epoch == len(DataLoader(DATA, 8, sampler=sampler()))  # type: ignore[operator]
    assert_same(nbscale_history(net, info), expected)


def test_an_explicit_shuffle_option_wins_over_the_loader_and_one_line_says_so() -> None:
    loader = DataLoader(DATA, 8, shuffle=True, drop_last=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, info = nbscale.train(network(), loader, options(shuffle="never"))
    said = [str(w.message) for w in caught if "shuffle='never'" in str(w.message)]
    assert said == [
        "TrainingOptions(shuffle='never') replaces the DataLoader's order (its shuffle or sampler); its batch_size "
        "and drop_last stand. Leave shuffle at its default to read the DataLoader as it is."
    ]
    assert info.iterations_per_epoch == 4  # the loader's drop_last stands: 38 samples, 4 full batches of 8


def test_the_default_shuffle_leaves_a_loader_alone_without_a_word() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nbscale.train(network(), DataLoader(DATA, 8, shuffle=True), options(max_epochs=1))
    assert not [w for w in caught if "DataLoader" in str(w.message)]


def test_resume_draws_the_loaders_order_on_from_where_its_generator_was(tmp_path: Path) -> None:
    def loader() -> DataLoader:
        return DataLoader(DATA, 8, shuffle=True, generator=generator())

    whole, whole_info = nbscale.train(network(), loader(), options(max_epochs=3))
    nbscale.train(network(), loader(), options(max_epochs=1, checkpoint_path=str(tmp_path)))
    resumed, info = nbscale.train(network(), loader(), options(max_epochs=3), resume_from=str(tmp_path))
    assert info.training_loss == whole_info.training_loss
    pairs = zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_a_validation_loaders_drop_last_leaves_its_partial_batch_out() -> None:
    validation = classes(20, seed=5)
    plain = network()
    expected = plain_loop(
        plain,
        DataLoader(DATA, 8, shuffle=True, generator=generator()),
        2,
        sgd(plain.parameters()),
        loss_fn=torch.nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        validation=DataLoader(validation, 8, drop_last=True),
        validate_every=5,
    )
    net, info = nbscale.train(
        network(),
        DataLoader(DATA, 8, shuffle=True, generator=generator()),
        options(validation_data=DataLoader(validation, 8, drop_last=True), validation_frequency=5),
    )
    assert_same(nbscale_history(net, info), expected)
