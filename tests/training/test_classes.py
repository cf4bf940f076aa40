"""Training checks the data's classes against the network's outputs before it starts (as MATLAB's trainNetwork
does), in the notebook and on a pool, and datastores can drop the classes a subset left without images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

import nbscale
from nbscale import OptionsError, TrainingOptions
from nbscale.data import AugmentedImageDatastore, ImageDatastore
from nbscale.training.head_checks import network_outputs
from tests.datasets import write_digits_pngs
from tests.training.digits import digits

TRAIN, VAL = digits()


@pytest.fixture(scope="module")
def digit_files(tmp_path_factory: pytest.TempPathFactory) -> ImageDatastore:
    """All ten digit classes, 30 PNGs each."""
    return ImageDatastore(write_digits_pngs(tmp_path_factory.mktemp("digits"), limit_per_class=30))


def quiet(**fields: object) -> TrainingOptions:
    base = {
        "initial_learn_rate": 0.05,
        "max_epochs": 1,
        "mini_batch_size": 20,
        "verbose": False,
        "execution_environment": "cpu",
    }
    return TrainingOptions("sgdm", **{**base, **fields})


def cnn(outputs: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, outputs))


class GlobalPoolNet(nn.Module):
    """A network without a last Linear (1x1 scoring convolution, then global pooling, as SqueezeNet)."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.score = nn.Conv2d(1, outputs, 1)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.score(x)).mean(dim=(2, 3))


def five_digits(ds: ImageDatastore) -> np.ndarray:
    return np.isin(np.array(ds.labels), ["3", "4", "5", "6", "7"])


def test_a_subset_keeps_every_class_and_remove_unused_classes_renumbers_the_rest(digit_files: ImageDatastore) -> None:
    subset = digit_files.subset(five_digits(digit_files))
    assert subset.classes == digit_files.classes and subset.count_each_label()["0"] == 0  # as MATLAB keeps categories
    kept = subset.remove_unused_classes()
    assert kept.classes == ["3", "4", "5", "6", "7"] and kept.files == subset.files and kept.labels == subset.labels
    assert kept.count_each_label() == {name: 30 for name in kept.classes}
    assert [kept[i][1] for i in (0, len(kept) - 1)] == [0, 4]  # "3" is now class 0, "7" class 4
    assert subset.classes == digit_files.classes  # a new datastore; the subset is unchanged
    dropped = digit_files.subset(five_digits(digit_files), drop_unused_classes=True)
    assert dropped.classes == kept.classes and dropped.labels == kept.labels
    assert {label for _, label in (dropped[i] for i in range(0, len(dropped), 7))} == set(range(5))


def test_augmented_datastores_drop_unused_classes_too(digit_files: ImageDatastore) -> None:
    augmented = AugmentedImageDatastore((8, 8), digit_files)
    dropped = augmented.subset(five_digits(digit_files), drop_unused_classes=True)
    assert isinstance(dropped, AugmentedImageDatastore) and dropped.classes == ["3", "4", "5", "6", "7"]
    assert dropped.count_each_label() == {name: 30 for name in dropped.classes}
    assert dropped[len(dropped) - 1][1] == 4
    kept = augmented.subset(five_digits(digit_files)).remove_unused_classes()
    assert kept.classes == dropped.classes and kept.output_size == (8, 8)
    with pytest.raises(nbscale.DatastoreError, match="needs a datastore with remove_unused_classes underneath"):
        AugmentedImageDatastore((8, 8), TensorDataset(torch.rand(4, 1, 8, 8), torch.arange(4))).remove_unused_classes()


def test_a_five_class_network_on_a_subset_with_ten_classes_is_refused_naming_both(digit_files: ImageDatastore) -> None:
    subset = digit_files.subset(five_digits(digit_files))
    model = cnn(5)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(OptionsError) as caught:
        nbscale.train(model, subset, quiet())
    message = str(caught.value)
    assert "train_data has 10 classes" in message and "label indices up to 7" in message
    assert "5 of them without images ([0, 1, 2, 8, 9])" in message
    assert "the network has 5 outputs (its last layer is Linear(in_features=512, out_features=5))" in message
    assert "remove_unused_classes()" in message and "drop_unused_classes=True" in message
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))  # nothing trained
    net, info = nbscale.train(model, subset.remove_unused_classes(), quiet())
    assert info.iteration[-1] == len(subset) // 20


def test_more_outputs_than_named_classes_is_refused_as_in_matlab(digit_files: ImageDatastore) -> None:
    five = digit_files.subset(five_digits(digit_files), drop_unused_classes=True)
    with pytest.raises(
        OptionsError,
        match=r"train_data has 5 classes \(\[3, 4, 5, 6, 7\]; label indices up to 4\), "
        r"but the network has 10 outputs.*build the network with 5 outputs",
    ):
        nbscale.train(cnn(10), five, quiet())


def test_tensor_labels_past_the_outputs_are_refused_instead_of_a_raw_index_error() -> None:
    with pytest.raises(
        OptionsError,
        match=r"train_data has label indices up to 9, so at least 10 classes, but the "
        r"network has 5 outputs",
    ):
        nbscale.train(nn.Sequential(nn.Linear(64, 5)), TRAIN, quiet(mini_batch_size=100))
    with pytest.raises(OptionsError, match="validation_data has label indices up to 9"):
        few = TRAIN[1] < 5
        nbscale.train(nn.Linear(64, 5), (TRAIN[0][few], TRAIN[1][few]), quiet(validation_data=VAL))
    with pytest.raises(OptionsError, match="train_data has label -1, but cross-entropy takes class indices"):
        nbscale.train(nn.Linear(64, 10), (TRAIN[0], TRAIN[1] - 1), quiet(mini_batch_size=100))
    # a loss of the user's own takes any targets
    nbscale.train(nn.Linear(64, 5), TRAIN, quiet(mini_batch_size=100), loss_fn=lambda out, y: out.float().mean() * 0)


def test_validation_data_with_other_classes_is_refused(digit_files: ImageDatastore) -> None:
    mask = five_digits(digit_files)
    train = digit_files.subset(mask, drop_unused_classes=True)
    with pytest.raises(
        OptionsError,
        match=r"train_data and validation_data have different classes \(\[3, 4, 5, 6, 7\] "
        r"and \[0, 1, .*\]\), so the same label index means different classes",
    ):
        nbscale.train(cnn(5), train, quiet(validation_data=digit_files.subset(mask)))


def test_a_network_without_a_last_linear_is_measured_by_one_forward_pass(digit_files: ImageDatastore) -> None:
    model = GlobalPoolNet(5).train()
    model.dropout.eval()  # a layer the user froze keeps its own mode
    sample = digit_files[0][0]
    state = torch.get_rng_state()
    assert network_outputs(model, sample) == (5, "its output for one sample has shape (1, 5)")
    assert model.training and not model.dropout.training and torch.equal(state, torch.get_rng_state())
    with pytest.raises(
        OptionsError,
        match=r"train_data has 10 classes .* but the network has 5 outputs \(its output "
        r"for one sample has shape \(1, 5\)\)",
    ):
        nbscale.train(model, digit_files.subset(five_digits(digit_files)), quiet())
    assert network_outputs(GlobalPoolNet(5), torch.zeros(64)) is None  # cannot run on the data: the loop tells


def test_torchvision_style_targets_and_subsets_are_checked_without_reading_images() -> None:
    class Targets(Dataset):
        def __init__(self) -> None:
            self.targets = [int(y) for y in TRAIN[1]]

        def __len__(self) -> int:
            return len(self.targets)

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return TRAIN[0][index], self.targets[index]

    with pytest.raises(OptionsError, match="label indices up to 9"):
        nbscale.train(nn.Linear(64, 8), Targets(), quiet(mini_batch_size=100))
    small = Subset(Targets(), [i for i, y in enumerate(TRAIN[1].tolist()) if y < 8])
    nbscale.train(nn.Linear(64, 8), small, quiet(mini_batch_size=100))


@pytest.mark.slow
def test_a_pool_run_is_refused_before_any_pool_starts(digit_files: ImageDatastore) -> None:
    assert nbscale.current_pool() is None
    with pytest.raises(OptionsError, match="the network has 5 outputs"):
        nbscale.train(cnn(5), digit_files.subset(five_digits(digit_files)), quiet(execution_environment="parallel"))
    assert nbscale.current_pool() is None


def test_preview_takes_images_from_every_class(digit_files: ImageDatastore, tmp_path: Path) -> None:
    from nbscale.data.montage import spread_over_classes

    assert spread_over_classes(["a", "a", "a", "b", "b", "c"], 5) == [0, 3, 5, 1, 4]
    assert spread_over_classes(None, 3) == [0, 1, 2]
    picture = digit_files.preview(10, columns=10)
    tiles = np.array(picture.convert("L"))[:96]
    # each tile is one digit, in class order: the tiles differ from each other (the first 10 items are all zeros)
    assert len({tiles[:, 96 * k : 96 * (k + 1)].tobytes() for k in range(10)}) == 10
    augmented = AugmentedImageDatastore((8, 8), digit_files).preview(10, columns=10)
    assert np.array_equal(np.array(augmented), np.array(picture))


def test_labels_the_loss_ignores_are_not_refused() -> None:
    labels = TRAIN[1].clone()
    labels[::7] = -100  # cross-entropy's ignore_index: padding, unlabelled items
    nbscale.train(nn.Linear(64, 10), (TRAIN[0], labels), quiet(mini_batch_size=100))
    labels[::7] = -1
    nbscale.train(
        nn.Linear(64, 10), (TRAIN[0], labels), quiet(mini_batch_size=100), loss_fn=nn.CrossEntropyLoss(ignore_index=-1)
    )
    with pytest.raises(OptionsError, match="train_data has label -1"):
        nbscale.train(nn.Linear(64, 10), (TRAIN[0], labels), quiet(mini_batch_size=100))
