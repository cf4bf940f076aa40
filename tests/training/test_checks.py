"""Bad inputs to nbscale.train fail before any training, with a message naming the input and the fix."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

import nbscale
from nbscale import OptionsError, TrainingOptions
from nbscale.errors import ModelError
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()


def quiet(**fields: object) -> TrainingOptions:
    base = {"initial_learn_rate": 0.1, "max_epochs": 1, "mini_batch_size": 100, "verbose": False}
    return TrainingOptions(fields.pop("solver", "sgdm"), **{**base, **fields})


class CountingLoss:
    """Cross-entropy that counts its calls: 0 calls means nothing was trained."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return nn.functional.cross_entropy(outputs, labels)


class Items(Dataset):
    def __init__(self, make_item: object) -> None:
        self.make_item = make_item

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> object:
        return self.make_item(index)  # type: ignore[operator]


def test_a_list_of_inputs_and_labels_trains_like_the_tuple() -> None:
    inputs, labels = TRAIN
    _, info = nbscale.train(tiny_net(), [inputs, labels], quiet(validation_data=[VAL[0], VAL[1]]))
    assert info.iteration[-1] == 1500 // 100 and info.final_validation_accuracy is not None


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ((TRAIN[0], TRAIN[1], TRAIN[1]), "as a tuple must be (inputs, labels), but it has 3 items"),
        (TRAIN[0], "train_data is a single Tensor, without labels"),
        (Items(lambda i: {"x": TRAIN[0][i], "y": TRAIN[1][i]}), "train_data yields dicts (keys ['x', 'y'])"),
        (Items(lambda i: (Image.new("L", (8, 8)), 1)), "yields PIL images: give its dataset transform="),
    ],
)
def test_data_that_is_no_input_label_pairs_is_refused_before_training(data: object, words: str) -> None:
    loss = CountingLoss()
    with pytest.raises(OptionsError) as caught:
        nbscale.train(tiny_net(), data, quiet(), loss_fn=loss)
    assert words in str(caught.value) and loss.calls == 0


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (tiny_net, "model must be a torch nn.Module"),
        (nn.Linear, "model is the class Linear, not a network: create one"),
    ],
)
def test_a_model_that_is_no_network_is_refused(model: object, words: str) -> None:
    with pytest.raises(OptionsError, match=words):
        nbscale.train(model, TRAIN, quiet())


@pytest.mark.parametrize(
    ("loss_fn", "words"),
    [
        ("msee", "loss_fn='msee' is not a loss: loss_fn must be one of 'crossentropy', 'mse'"),
        (3, "loss_fn must be a loss name such as 'mse', or a function of (outputs, labels) returning the loss"),
        (nn.MSELoss, "loss_fn is the class MSELoss, not a loss: create one, e.g. loss_fn=MSELoss()"),
    ],
)
def test_a_loss_fn_that_is_no_loss_is_refused_naming_it(loss_fn: object, words: str) -> None:
    with pytest.raises(OptionsError) as caught:
        nbscale.train(tiny_net(), TRAIN, quiet(), loss_fn=loss_fn)
    assert words in str(caught.value)


class FailsAtIteration(nn.Module):
    """A network whose forward fails at one iteration, as a bug in a user's forward would."""

    def __init__(self, failing_call: int) -> None:
        super().__init__()
        self.layer, self.calls, self.failing_call = nn.Linear(64, 10), 0, failing_call

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.failing_call:
            raise RuntimeError("a bug in forward")
        return self.layer(inputs)


def test_a_network_that_does_not_fit_the_data_fails_naming_the_batch_shapes_and_the_fix() -> None:
    misfit = nn.Sequential(nn.Linear(100, 32), nn.ReLU(), nn.Linear(32, 10))  # digits have 64 features
    with pytest.raises(ModelError) as caught:
        nbscale.train(misfit, TRAIN, quiet())
    message = str(caught.value)
    assert "The first mini-batch failed in the network or its loss: RuntimeError: mat1 and mat2 shapes" in message
    assert (
        "inputs are a torch.float32 tensor of shape 100x64 and its labels a torch.int64 tensor of shape 100" in message
    )
    assert "first nn.Linear's in_features is C*H*W" in message
    assert isinstance(caught.value.__cause__, RuntimeError)  # torch's own error and traceback stay visible
    gray_into_colour = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 10))
    with pytest.raises(ModelError, match=r"takes 3-channel images but the data has 1 channel.*color_preprocessing="):
        nbscale.train(gray_into_colour, (TRAIN[0].reshape(-1, 1, 8, 8), TRAIN[1]), quiet())
    lazy_misfit = nn.Sequential(nn.LazyConv2d(4, 3), nn.Flatten(), nn.LazyLinear(10))  # a conv of flat digits
    with pytest.raises(ModelError, match=r"^The first sample failed in the network or its loss: .*shape 1x64 "):
        nbscale.train(lazy_misfit, TRAIN, quiet())
    with pytest.raises(RuntimeError, match="^a bug in forward$"):  # later in training: the error as it came
        nbscale.train(FailsAtIteration(3), TRAIN, quiet())


def test_whole_float_labels_train_with_cross_entropy_and_fractional_ones_are_refused() -> None:
    inputs, labels = TRAIN
    _, info = nbscale.train(tiny_net(), (inputs.numpy().astype("float64"), labels.numpy().astype(float)), quiet())
    assert info.iteration[-1] == 15 and info.training_accuracy[-1] is not None
    with pytest.raises(OptionsError, match="train_data has float labels.*pass loss_fn="):
        nbscale.train(tiny_net(), (inputs, labels.float() + 0.5), quiet())
    # with a loss of its own, float targets are the user's business (regression)
    nbscale.train(nn.Linear(64, 1), (inputs, labels.float()[:, None]), quiet(), loss_fn=nn.MSELoss())


def test_a_checkpoint_path_that_cannot_hold_checkpoints_fails_before_the_first_epoch(tmp_path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("a file, not a folder")
    for folder in (str(a_file), "/proc/no-such-folder"):
        loss = CountingLoss()
        with pytest.raises(OptionsError, match=f"checkpoint_path='{folder}' cannot be used as a folder"):
            nbscale.train(tiny_net(), TRAIN, quiet(checkpoint_path=folder), loss_fn=loss)
        assert loss.calls == 0


def test_a_checkpoint_path_in_the_home_folder_is_written_there_and_resumes(tmp_path, monkeypatch) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2, checkpoint_path="~/runs"))
    assert sorted(p.name for p in (home / "runs").iterdir()) == [
        "nbscale_checkpoint_epoch0001.pt",
        "nbscale_checkpoint_epoch0002.pt",
    ]
    assert list(work.iterdir()) == []  # no folder named "~" where the notebook runs
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3, checkpoint_path="~/runs"), resume_from="~/runs")
    assert info.epoch[-1] == 3 and (home / "runs" / "nbscale_checkpoint_epoch0003.pt").exists()


@pytest.fixture
def checkpoint(tmp_path) -> str:
    """The checkpoint folder of a 2-epoch run (mini_batch_size 100, sgdm, the 1500 training digits)."""
    nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2, checkpoint_path=str(tmp_path)))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("model", "data", "fields", "words"),
    [
        (tiny_net, TRAIN, {"mini_batch_size": 50}, "mini_batch_size=100 there, 50 here"),
        (tiny_net, TRAIN, {"solver": "adam"}, "solver='sgdm' there, 'adam' here"),
        (tiny_net, (TRAIN[0][:500], TRAIN[1][:500]), {}, "train_data of 1500 samples there, 500 here"),
        (lambda: nn.Linear(64, 10), TRAIN, {}, "holds another network's weights"),
    ],
)
def test_resuming_a_different_run_is_refused(checkpoint: str, model, data, fields, words) -> None:
    with pytest.raises(OptionsError) as caught:
        nbscale.train(model(), data, quiet(max_epochs=4, **fields), resume_from=checkpoint)
    assert f"resume_from='{checkpoint}'" in str(caught.value) and words in str(caught.value)


def test_a_file_that_is_no_checkpoint_is_named(tmp_path) -> None:
    corrupt, weights = tmp_path / "corrupt.pt", tmp_path / "weights.pt"
    corrupt.write_bytes(b"not a checkpoint")
    torch.save(tiny_net().state_dict(), weights)
    with pytest.raises(OptionsError, match="cannot be read as a checkpoint"):
        nbscale.train(tiny_net(), TRAIN, quiet(), resume_from=corrupt)
    with pytest.raises(OptionsError, match="is not an nbscale training checkpoint.*load_state_dict"):
        nbscale.train(tiny_net(), TRAIN, quiet(), resume_from=weights)


def test_a_resume_from_that_is_no_path_is_refused_naming_it() -> None:
    with pytest.raises(
        OptionsError, match="resume_from=5 is not a path: pass a checkpoint file or the checkpoint_path"
    ):
        nbscale.train(tiny_net(), TRAIN, quiet(), resume_from=5)  # type: ignore[arg-type]


def test_a_resumed_run_goes_on_counting_time_and_images(checkpoint: str) -> None:
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=4), resume_from=checkpoint)
    assert info.iteration == list(range(1, 4 * 15 + 1))
    assert info.time == sorted(info.time)


def test_resuming_with_no_epochs_left_says_to_raise_max_epochs(checkpoint: str) -> None:
    with pytest.warns(RuntimeWarning, match="trained to epoch 2, so max_epochs=2 trains no further: raise max_epochs"):
        _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2), resume_from=checkpoint)
    assert info.stop_reason == "Max epochs completed" and info.epoch[-1] == 2
