"""Data as PyTorch users bring it: a DataLoader (its collate_fn and batch_size), nested batches (two inputs, dict
inputs), models with several outputs, in the notebook's process and on a pool of 2 real CPU workers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    default_collate,
)

import nbscale
from nbscale import OptionsError, TrainingOptions

pytestmark = pytest.mark.slow


class TwoInputs(Dataset):
    """Items ((x, extra), label): the label is which of x's first and extra's first is larger."""

    def __init__(self, count: int = 128, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x, self.extra = torch.randn(count, 4, generator=generator), torch.randn(count, 2, generator=generator)
        self.y = (self.x[:, 0] > self.extra[:, 0]).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        return (self.x[index], self.extra[index]), self.y[index]


class DictInputs(TwoInputs):
    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {"x": self.x[index], "extra": self.extra[index]}, self.y[index]


class TwoInputNet(nn.Module):
    """forward(x, extra) -> (class scores, a second output)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.a(x) + self.b(extra)
        return scores, scores.detach().sum(dim=1)


def first_output_loss(outputs: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs[0], labels)


def doubled(items: list) -> list:
    """A collate_fn: torch's, then every x doubled and a marker that it ran."""
    (x, extra), y = default_collate(items)
    doubled.calls += 1  # type: ignore[attr-defined]
    return [(2 * x, extra), y]


doubled.calls = 0  # type: ignore[attr-defined]


def options(**changes) -> TrainingOptions:
    return TrainingOptions("adam", max_epochs=3, initial_learn_rate=0.05, verbose=False, plots="none", **changes)


def test_a_dataloaders_collate_fn_and_batch_size_are_used_with_two_input_batches() -> None:
    torch.manual_seed(0)
    before = doubled.calls  # type: ignore[attr-defined]
    loader = DataLoader(TwoInputs(), batch_size=16, shuffle=True, collate_fn=doubled)
    net, info = nbscale.train(
        TwoInputNet(), loader, options(validation_data=DataLoader(TwoInputs(64, 1))), loss_fn=first_output_loss
    )
    assert info.mini_batch_size == 16
    assert doubled.calls - before >= 3 * (128 // 16)  # type: ignore[attr-defined]
    assert info.final_validation_loss is not None and info.final_validation_loss < 0.69


def test_a_dict_input_model_trains_and_classifies_from_its_first_output() -> None:
    torch.manual_seed(0)
    net, info = nbscale.train(TwoInputNet(), DictInputs(), options(mini_batch_size=16), loss_fn=first_output_loss)
    assert info.stop_reason == "Max epochs completed"
    labels, scores = nbscale.classify(net, DictInputs(64, 1))
    assert scores.shape == (64, 2) and len(labels) == 64
    assert nbscale.accuracy(net, TwoInputs(64, 1)) > 0.6
    assert nbscale.predict(net, DataLoader(TwoInputs(64, 1), batch_size=10)).shape == (64, 2)


def test_nested_batches_and_a_collate_fn_train_on_a_pool_of_two(pool: nbscale.Pool) -> None:
    torch.manual_seed(0)
    loader = DataLoader(TwoInputs(), batch_size=16, collate_fn=doubled)
    net, info = nbscale.train(
        TwoInputNet(),
        loader,
        options(execution_environment="parallel", validation_data=DictInputs(64, 1)),
        loss_fn=first_output_loss,
    )
    assert info.stop_reason == "Max epochs completed" and info.mini_batch_size == 16
    assert nbscale.accuracy(net, TwoInputs(64, 1)) > 0.6


def recording_sizes(items: list) -> list:
    """A collate_fn: torch's, recording each batch's size."""
    recording_sizes.sizes.append(len(items))  # type: ignore[attr-defined]
    return default_collate(items)


recording_sizes.sizes = []  # type: ignore[attr-defined]


def test_a_validation_dataloaders_batch_size_is_the_validation_batch() -> None:
    recording_sizes.sizes.clear()  # type: ignore[attr-defined]
    validation = DataLoader(TwoInputs(64, 1), batch_size=10, collate_fn=recording_sizes)
    _, info = nbscale.train(
        TwoInputNet(),
        DataLoader(TwoInputs(), batch_size=16),
        options(validation_data=validation, validation_frequency=4),
        loss_fn=first_output_loss,
    )
    validations = sum(loss is not None for loss in info.validation_loss)
    assert validations > 3
    # the 64 samples in batches of 10 at every validation, not in the training's 16s
    assert recording_sizes.sizes == [10, 10, 10, 10, 10, 10, 4] * validations  # type: ignore[attr-defined]


def test_a_dataloader_batch_size_different_from_mini_batch_size_is_one_error_naming_both() -> None:
    with pytest.raises(OptionsError) as caught:
        nbscale.train(
            TwoInputNet(),
            DataLoader(TwoInputs(), batch_size=16),
            options(mini_batch_size=32),
            loss_fn=first_output_loss,
        )
    assert str(caught.value).startswith(
        "train_data is a DataLoader with batch_size=16, but TrainingOptions has mini_batch_size=32: set one of them"
    )


class Stream(IterableDataset):
    def __iter__(self):
        return iter([])


@pytest.mark.parametrize(
    ("loader", "said"),
    [
        (
            DataLoader(TwoInputs(), batch_sampler=BatchSampler(SequentialSampler(range(128)), 8, False)),
            "train_data is a DataLoader with its own batch_sampler (BatchSampler), which nbscale cannot follow",
        ),
        (
            DataLoader(TwoInputs(6), batch_size=8, drop_last=True),
            "train_data is a DataLoader that yields no batch: its 6 samples are fewer than batch_size=8 with "
            "drop_last=True",
        ),
        (
            DataLoader(Stream(), batch_size=8),
            "train_data is a DataLoader over an IterableDataset (Stream), which nbscale cannot index",
        ),
    ],
)
def test_a_dataloader_nbscale_cannot_follow_is_refused_by_name_saying_what_is_supported(loader, said) -> None:
    with pytest.raises(OptionsError) as caught:
        nbscale.train(TwoInputNet(), loader, options(), loss_fn=first_output_loss)
    assert str(caught.value).startswith(said)
    supported = "Supported: DataLoader(dataset, batch_size=..., shuffle=... or sampler=..., drop_last=..."
    assert supported in str(caught.value)


def test_predict_and_classify_use_the_first_output_of_a_tuple_output_model() -> None:
    net = TwoInputNet()
    data = TwoInputs(32)
    scores = nbscale.predict(net, data)
    expected = net(data.x, data.extra)[0].detach()
    assert torch.allclose(scores, expected, atol=1e-6)
    labels, _ = nbscale.classify(net, data)
    assert labels.tolist() == expected.argmax(dim=1).tolist()
