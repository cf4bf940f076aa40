"""nbscale.train in the notebook's process: real training on digits and the effect of every option."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import nbscale
from nbscale import OptionsError, TrainingOptions
from nbscale.data.loader_data import epoch_order
from nbscale.data.loading import split_batch
from nbscale.training.loop import clip_gradients
from tests.training.digits import ViewsItsFeatures, digits, tiny_net

TRAIN, VAL = digits()


def quiet(**fields: object) -> TrainingOptions:
    base = {"initial_learn_rate": 0.1, "max_epochs": 3, "mini_batch_size": 64, "verbose": False}
    return TrainingOptions(fields.pop("solver", "sgdm"), **{**base, **fields})


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_trains_digits_to_90_percent_validation_accuracy() -> None:
    torch.manual_seed(0)
    net, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=8, validation_data=VAL, validation_frequency=40))
    assert info.final_validation_accuracy >= 0.90
    assert info.stop_reason == "Max epochs completed" and info.images_per_second > 0
    frame = info.to_dataframe()
    assert len(frame) == 8 * (1500 // 64) and frame["training_loss"].iloc[-1] < frame["training_loss"].iloc[0]
    assert frame["validation_loss"].notna().sum() >= 3 and set(frame["epoch"]) == set(range(1, 9))


def test_training_accuracy_is_the_fraction_of_each_mini_batch_classified_right() -> None:
    net, _ = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2))
    with torch.no_grad():
        expected = [
            (net(x).argmax(1) == y).float().mean().item()
            for x, y in zip(TRAIN[0].split(100), TRAIN[1].split(100), strict=True)
        ]
    # a learn rate so small the network does not change: each iteration's accuracy is known in advance
    _, info = nbscale.train(
        net,
        TRAIN,
        quiet(
            max_epochs=1,
            mini_batch_size=100,
            shuffle="never",
            initial_learn_rate=1e-12,
            momentum=0.0,
            l2_regularization=0.0,
        ),
    )
    assert info.training_accuracy == pytest.approx(expected, abs=1e-6)
    assert 0.5 < min(info.training_accuracy) and max(info.training_accuracy) <= 1.0


def test_training_accuracy_is_none_when_outputs_are_not_class_scores() -> None:
    inputs, labels = TRAIN[0], TRAIN[0][:, :1] * 2
    _, info = nbscale.train(nn.Linear(64, 1), (inputs, labels), quiet(max_epochs=1), loss_fn=nn.MSELoss())
    assert set(info.training_accuracy) == {None} and all(math.isfinite(v) for v in info.training_loss)


class RunsOutOfMemory(nn.Module):
    """A network whose forward fails as a GPU out of memory does (torch.OutOfMemoryError)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_suggests_a_smaller_mini_batch() -> None:
    with pytest.raises(torch.OutOfMemoryError, match=r"mini_batch_size=64: lower mini_batch_size") as caught:
        nbscale.train(RunsOutOfMemory(), TRAIN, quiet())
    assert "Tried to allocate 20.00 GiB" in str(caught.value)


@pytest.mark.parametrize("solver", ["sgdm", "adam", "adamw", "rmsprop"])
def test_every_solver_learns(solver: str) -> None:
    torch.manual_seed(0)
    rate = 0.1 if solver == "sgdm" else 0.005
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(solver=solver, initial_learn_rate=rate, max_epochs=2))
    assert info.training_loss[-1] < 0.6 * info.training_loss[0]


def test_info_learn_rate_follows_the_schedule() -> None:
    options = quiet(max_epochs=4, learn_rate_schedule="piecewise", learn_rate_drop_period=2, learn_rate_drop_factor=0.5)
    _, info = nbscale.train(tiny_net(), TRAIN, options)
    per_epoch = {e: r for e, r in zip(info.epoch, info.learn_rate, strict=True)}
    assert per_epoch == pytest.approx({1: 0.1, 2: 0.1, 3: 0.05, 4: 0.05})


@pytest.mark.parametrize("method", ["l2norm", "global-l2norm", "absolute-value"])
def test_gradient_clipping_methods(method: str) -> None:
    model = nn.Linear(4, 3)
    model.weight.grad = torch.full((3, 4), 2.0)
    model.bias.grad = torch.tensor([3.0, 0.0, 4.0])
    clip_gradients(model, method, 1.0)
    if method == "l2norm":  # each parameter's gradient on its own
        assert model.weight.grad.norm().item() == pytest.approx(1.0)
        assert model.bias.grad.norm().item() == pytest.approx(1.0)
    elif method == "global-l2norm":  # all together, directions kept
        total = torch.cat([model.weight.grad.flatten(), model.bias.grad]).norm().item()
        assert total == pytest.approx(1.0, rel=1e-4) and model.bias.grad[0] / model.bias.grad[2] == pytest.approx(0.75)
    else:
        assert model.weight.grad.max().item() == 1.0 and model.bias.grad.tolist() == [1.0, 0.0, 1.0]


def test_patience_stops_when_validation_loss_stops_improving() -> None:
    torch.manual_seed(0)
    options = quiet(
        max_epochs=200, initial_learn_rate=0.3, validation_data=VAL, validation_frequency=5, validation_patience=3
    )
    _, info = nbscale.train(tiny_net(), TRAIN, options)
    assert info.stop_reason.startswith("Met validation criterion") and info.epoch[-1] < 200
    losses = [v for v in info.validation_loss if v is not None]
    assert min(losses[-3:]) >= min(losses[:-3])


def test_best_validation_returns_the_network_of_the_lowest_validation_loss() -> None:
    torch.manual_seed(0)
    options = quiet(
        max_epochs=6,
        initial_learn_rate=0.5,
        validation_data=VAL,
        validation_frequency=10,
        output_network="best-validation",
    )
    net, info = nbscale.train(tiny_net(), TRAIN, options)
    losses = [(v, i) for v, i in zip(info.validation_loss, info.iteration, strict=True) if v is not None]
    best_loss, best_iteration = min(losses)
    assert info.output_network_iteration == best_iteration
    outputs = net(VAL[0])
    assert nn.functional.cross_entropy(outputs, VAL[1]).item() == pytest.approx(best_loss, rel=1e-5)


def test_checkpoint_then_resume_equals_training_straight_through(tmp_path) -> None:
    options = quiet(
        max_epochs=4,
        shuffle="every-epoch",
        solver="adam",
        initial_learn_rate=0.01,
        learn_rate_schedule="cosine",
        checkpoint_path=str(tmp_path),
        checkpoint_frequency=2,
    )
    torch.manual_seed(7)
    straight, _ = nbscale.train(tiny_net(), TRAIN, options)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "nbscale_checkpoint_epoch0002.pt",
        "nbscale_checkpoint_epoch0004.pt",
    ]
    (tmp_path / "nbscale_checkpoint_epoch0004.pt").unlink()  # as if it had stopped after epoch 3
    resumed, info = nbscale.train(tiny_net(seed=99), TRAIN, options, resume_from=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(weights(straight), weights(resumed), strict=True))
    assert info.iteration == list(range(1, 4 * (1500 // 64) + 1))  # the history of the whole run


def test_resume_with_augmented_images_equals_training_straight_through(tmp_path) -> None:
    from nbscale.data import AugmentedImageDatastore, ImageAugmenter

    images = torch.utils.data.TensorDataset(TRAIN[0].view(-1, 1, 8, 8), TRAIN[1])
    data = AugmentedImageDatastore((8, 8), images, ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-1, 1)))
    options = quiet(max_epochs=3, shuffle="every-epoch", checkpoint_path=str(tmp_path))

    def net(seed: int = 0) -> nn.Module:
        return nn.Sequential(nn.Flatten(), tiny_net(seed))

    torch.manual_seed(7)
    straight, _ = nbscale.train(net(), data, options)
    (tmp_path / "nbscale_checkpoint_epoch0003.pt").unlink()
    (tmp_path / "nbscale_checkpoint_epoch0002.pt").unlink()  # as if it had stopped after epoch 1
    resumed, _ = nbscale.train(net(seed=99), data, options, resume_from=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(weights(straight), weights(resumed), strict=True))


def test_resume_from_a_folder_continues_the_run_that_wrote_there_last(tmp_path) -> None:
    """A run started again in the folder with fewer epochs leaves the first run's later epochs there; resuming
    the folder continues the later run, not the first run's highest epoch."""
    folder = str(tmp_path / "checkpoints")
    nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3, checkpoint_path=folder, initial_learn_rate=0.01))
    _, later = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2, checkpoint_path=folder, initial_learn_rate=0.3))
    _, resumed = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=4, initial_learn_rate=0.3), resume_from=folder)
    kept = len(later.iteration)
    assert resumed.learn_rate[:kept] == later.learn_rate and resumed.training_loss[:kept] == later.training_loss
    assert resumed.epoch[kept] == 3


def test_resume_from_a_missing_checkpoint_says_so(tmp_path) -> None:
    with pytest.raises(OptionsError, match="no checkpoint"):
        nbscale.train(tiny_net(), TRAIN, quiet(), resume_from=tmp_path)


def test_output_fn_sees_the_info_each_iteration_and_true_stops() -> None:
    seen: list[int] = []

    def stop_at_ten(info: nbscale.TrainingInfo) -> bool:
        seen.append(info.iteration[-1])
        return info.iteration[-1] == 10

    _, info = nbscale.train(tiny_net(), TRAIN, quiet(output_fn=stop_at_ten))
    assert seen == list(range(1, 11)) and info.stop_reason == "Stopped by output_fn"


def test_nan_loss_stops_and_names_the_iteration() -> None:
    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(outputs, labels)
        return loss * math.nan if loss_fn.calls == 4 else (setattr(loss_fn, "calls", loss_fn.calls + 1) or loss)

    loss_fn.calls = 0
    with pytest.warns(RuntimeWarning, match="iteration 5") as caught:
        _, info = nbscale.train(tiny_net(), TRAIN, quiet(), loss_fn=loss_fn)
    assert "nan at iteration 5" in info.stop_reason and info.iteration[-1] == 5
    assert caught[0].filename == __file__  # the notebook shows the user's line, not nbscale's


def test_mixed_precision_on_the_cpu_warns_at_the_users_call() -> None:
    with pytest.warns(RuntimeWarning, match="precision='mixed' only speeds up GPUs") as caught:
        nbscale.train(tiny_net(), TRAIN, quiet(precision="mixed"))
    assert [warning.filename for warning in caught] == [__file__]


def test_a_worker_load_for_several_workers_in_the_notebooks_process_says_it_needs_a_pool() -> None:
    with pytest.raises(
        OptionsError,
        match=r"worker_load=\[3, 1\] splits each mini-batch across a pool's workers, but "
        r"execution_environment='cpu' trains in this process: use execution_environment="
        r"'parallel'",
    ):
        nbscale.train(tiny_net(), TRAIN, quiet(worker_load=[3, 1], execution_environment="cpu"))


def test_shuffle_modes() -> None:
    assert torch.equal(epoch_order("never", 1, 3, 10), torch.arange(10))
    assert torch.equal(epoch_order("once", 1, 1, 10), epoch_order("once", 1, 5, 10))
    assert not torch.equal(epoch_order("every-epoch", 1, 1, 50), epoch_order("every-epoch", 1, 2, 50))


def test_worker_load_splits_the_mini_batch() -> None:
    assert split_batch(128, None, 2) == [64, 64]
    assert split_batch(100, [3, 1], 2) == [75, 25]
    assert split_batch(10, [1, 0, 1], 3) == [5, 0, 5]
    assert sum(split_batch(97, [1, 1, 1], 3)) == 97
    with pytest.raises(OptionsError, match="one weight per worker"):
        split_batch(64, [1, 1, 1], 2)


def test_streamed_and_background_data_train_like_in_memory_tensors() -> None:
    dataset = torch.utils.data.TensorDataset(*TRAIN)
    results = []
    for fields in ({"data_placement": "device"}, {"data_placement": "stream"}, {"dispatch_in_background": True}):
        torch.manual_seed(3)
        net, _ = nbscale.train(tiny_net(), dataset, quiet(max_epochs=1, **fields))
        results.append(weights(net))
    for other in results[1:]:
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0], other, strict=True))


def test_bad_training_data_is_an_options_error() -> None:
    with pytest.raises(OptionsError, match="train_data"):
        nbscale.train(tiny_net(), [1, 2, 3][0], quiet())


@pytest.mark.slow
def test_gpu_training_where_no_gpu_is_visible_names_the_fix() -> None:
    """In a process that sees no GPU (CUDA_VISIBLE_DEVICES="" hides any this machine has)."""
    code = (
        "import nbscale\nfrom tests.training.digits import digits, tiny_net\n"
        "options = nbscale.TrainingOptions('sgdm', execution_environment='gpu', verbose=False)\n"
        "try:\n    nbscale.train(tiny_net(), digits()[0], options)\n"
        "except nbscale.OptionsError as error:\n    print(error)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        cwd=Path(__file__).parents[2],
    )
    assert (
        "execution_environment='gpu' but no CUDA GPU is visible to this process (torch.cuda.is_available() is "
        "False): use execution_environment='auto' or 'cpu'" in shown.stdout
    ), shown.stdout + shown.stderr


@pytest.mark.gpu
def test_gpu_and_mixed_precision_train_digits() -> None:
    torch.manual_seed(0)
    for precision in ("single", "mixed"):
        _, info = nbscale.train(
            tiny_net(),
            TRAIN,
            quiet(max_epochs=5, execution_environment="gpu", precision=precision, validation_data=VAL),
        )
        assert "cuda" in info.hardware and info.final_validation_accuracy >= 0.85


def test_figures_read_in_bunches_give_the_same_history_validation_and_nan_stop() -> None:
    """The loop reads the loss and accuracy in bunches (no host sync per iteration), unless a listener needs every
    iteration's figures at once, as output_fn does: both must give the same history, validation, patience and
    NaN stop."""

    def run(every_iteration: bool, loss_fn=None) -> tuple[list[torch.Tensor], nbscale.TrainingInfo]:
        seen: list[int] = []
        options = quiet(
            validation_data=VAL,
            validation_frequency=9,
            validation_patience=3,
            max_epochs=4,
            output_fn=(lambda info: seen.append(info.iteration[-1])) if every_iteration else None,
        )
        torch.manual_seed(3)
        net, info = nbscale.train(tiny_net(), TRAIN, options, loss_fn=loss_fn)
        if every_iteration:
            assert seen == info.iteration  # output_fn saw each iteration's figures as it ended
        return weights(net), info

    (every, info_every), (bunched, info_bunched) = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(every, bunched, strict=True))
    for column in (
        "epoch",
        "iteration",
        "training_loss",
        "training_accuracy",
        "validation_loss",
        "validation_accuracy",
        "learn_rate",
    ):
        assert getattr(info_every, column) == getattr(info_bunched, column), column
    assert info_every.stop_reason == info_bunched.stop_reason

    for every_iteration in (True, False):

        def nan_at_12(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            nan_at_12.calls += torch.is_grad_enabled()  # training calls only, not validation's
            return nn.functional.cross_entropy(outputs, labels) * (math.nan if nan_at_12.calls == 12 else 1.0)

        nan_at_12.calls = 0
        with pytest.warns(RuntimeWarning, match="iteration 12"):
            _, info = run(every_iteration, nan_at_12)
        assert info.iteration[-1] == 12 and "nan at iteration 12" in info.stop_reason


@pytest.mark.parametrize("after_seconds", [0.0, 0.003, 0.011, 0.029])
def test_an_interrupt_anywhere_in_the_loop_returns_a_history_that_ends_where_the_network_stopped(after_seconds) -> None:
    """The figures are reported a bunch late (nbscale.training.figures): a stop that lands while they are told must
    still end the history at the last iteration the network trained, with no iteration missing."""
    net, trained = tiny_net(), []

    def count_and_interrupt(module: nn.Module, _inputs: object) -> None:
        if module.training:
            trained.append(1)
            if len(trained) == 40:  # in the loop, so the interrupt asks for a stop; at some moment after it
                threading.Timer(after_seconds, os.kill, (os.getpid(), signal.SIGINT)).start()

    net.register_forward_pre_hook(count_and_interrupt)
    _, info = nbscale.train(net, TRAIN, quiet(max_epochs=500))
    assert info.stop_reason == "Stopped by kernel interrupt"
    assert info.iteration == list(range(1, len(trained) + 1))


def test_labels_as_a_list_numpy_array_column_or_narrow_integers_train_like_int64_tensors() -> None:
    inputs, labels = TRAIN
    val_inputs, val_labels = VAL
    results = []
    for train_data, validation_data in (
        ((inputs, labels), (val_inputs, val_labels)),
        ((inputs, labels.tolist()), (val_inputs, val_labels.tolist())),
        ((inputs.double().numpy(), labels.numpy()), (val_inputs.numpy(), val_labels.numpy().astype("int32"))),
        ((inputs, labels.int()), (val_inputs, val_labels.to(torch.uint8))),
        ((inputs, labels.numpy()[:, None]), (val_inputs, val_labels[:, None])),  # a column of labels
        (
            torch.utils.data.TensorDataset(inputs, labels.short()),
            torch.utils.data.TensorDataset(val_inputs, val_labels.int()),
        ),
    ):
        torch.manual_seed(5)
        net, info = nbscale.train(tiny_net(), train_data, quiet(max_epochs=1, validation_data=validation_data))
        results.append((weights(net), info.final_validation_accuracy))
    for other, accuracy in results[1:]:
        assert accuracy == pytest.approx(results[0][1])
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0][0], other, strict=True))
    with pytest.raises(OptionsError, match="1500 inputs and 3 labels"):
        nbscale.train(tiny_net(), (inputs, [1, 2, 3]), quiet())


class _RegressionSamples(torch.utils.data.Dataset):
    """A plain Dataset of (input, float target): scalar targets that must not be rounded to class indices."""

    def __init__(self, vector: bool) -> None:
        self.inputs, self.vector = TRAIN[0], vector

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        target = self.inputs[index, :2] * 2.5 + 0.25
        return self.inputs[index], target if self.vector else target[0]


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
@pytest.mark.parametrize("placement", ["auto", "device", "stream"])
def test_a_dataset_of_float_targets_trains_a_regression_on_the_exact_targets(placement: str) -> None:
    for vector in (True, False):
        model = nn.Linear(64, 2) if vector else nn.Sequential(nn.Linear(64, 1), nn.Flatten(0))
        _, info = nbscale.train(
            model,
            _RegressionSamples(vector),
            quiet(
                solver="adam",
                max_epochs=30,
                data_placement=placement,
                l2_regularization=0.0,
                initial_learn_rate=0.02,
                validation_data=_RegressionSamples(vector),
                validation_frequency=100,
            ),
            loss_fn=nn.MSELoss(),
        )
        assert set(info.training_accuracy) == {None} and info.final_validation_accuracy is None
        # rounded to integers the targets could not be fitted this closely
        assert info.final_validation_loss < 0.01, (vector, info.final_validation_loss)


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)
    )


IMAGES = (TRAIN[0].reshape(-1, 1, 8, 8), TRAIN[1])


def test_a_conv_net_trains_in_channels_last_on_the_cpu_unless_it_cannot() -> None:
    """The CPU's convolutions (oneDNN) run fastest on NHWC data, as a GPU's do: a conv net trains in
    channels_last and comes back in NCHW; one that `.view`s a convolution's output trains in NCHW."""
    conv = _conv_net()
    layouts: list[bool] = []
    conv[2].register_forward_pre_hook(lambda module, args: layouts.append(module.weight.is_contiguous()))
    trained, info = nbscale.train(conv, IMAGES, quiet(max_epochs=2, execution_environment="cpu"))
    assert False in layouts and trained[2].weight.is_contiguous()  # trained in channels_last, given back in NCHW
    assert info.training_accuracy[-1] > 0.5
    viewing = ViewsItsFeatures()
    _, info = nbscale.train(viewing, IMAGES, quiet(max_epochs=2, execution_environment="cpu"))
    assert info.stop_reason == "Max epochs completed" and viewing.conv.weight.is_contiguous()


@pytest.mark.parametrize("environment", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_conv_net_comes_back_in_the_layout_it_came_in_even_when_training_fails(environment: str) -> None:
    """Conv nets train in channels_last; the network still comes back in the layout it came in (code in the
    notebook may `.view` its weights), also when training raised."""
    options = quiet(
        max_epochs=1, execution_environment=environment, precision="mixed" if environment == "gpu" else "single"
    )

    def fails_at_iteration_3(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        fails_at_iteration_3.calls += 1
        if fails_at_iteration_3.calls == 3:
            raise RuntimeError("failed on purpose")
        return nn.functional.cross_entropy(outputs.float(), labels)

    fails_at_iteration_3.calls = 0
    conv = _conv_net()
    with pytest.raises(RuntimeError, match="failed on purpose"):
        nbscale.train(conv, IMAGES, options, loss_fn=fails_at_iteration_3)
    assert conv[2].weight.is_contiguous()  # 8 channels in: NCHW and channels_last differ
    trained, _ = nbscale.train(_conv_net(), IMAGES, options)
    assert trained[2].weight.is_contiguous()
    chosen = _conv_net().to(memory_format=torch.channels_last)  # a user's own choice is left alone
    assert not chosen[2].weight.is_contiguous()
    trained, _ = nbscale.train(chosen, IMAGES, options)
    assert trained[2].weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow
def test_training_on_tensors_does_not_import_torchvision() -> None:
    """A kernel's first training of a network on tensors pays no torchvision import (datastore checks and the
    learn-rate factors import nbscale.data and nbscale.models, which load torchvision only when they need it)."""
    script = (
        "import sys, torch, nbscale\n"
        "data = (torch.randn(64, 4), torch.randint(0, 3, (64,)))\n"
        "nbscale.train(torch.nn.Linear(4, 3), data, nbscale.TrainingOptions('sgdm', max_epochs=1, "
        "plots='none', verbose=False))\n"
        "print(sorted(m for m in sys.modules if m.startswith('torchvision')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
