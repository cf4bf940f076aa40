"""The contract's and the docs' data and training examples run as written in a real kernel, on image files
(scikit-learn's digits as PNGs in images/), and give what the text says they give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.datasets import write_digits_pngs
from tests.kernel_session import REPO_ROOT, KernelSession

# The contract's (API.md) Data and Training blocks, word for word; the contract leaves `model` to the user.
CONTRACT_DATA = """\
from nbscale.data import ImageDatastore, ImageAugmenter, AugmentedImageDatastore
ds = ImageDatastore("images/", include_subfolders=True, label_source="foldernames")
train_ds, val_ds = ds.split_each_label(0.9, randomize=True, seed=0)
aug = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-4, 4), rand_y_translation=(-4, 4))
train_aug = AugmentedImageDatastore((32, 32), train_ds, augmenter=aug)
"""
MODEL = """\
import nbscale, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(16 * 4 * 4, 10))
"""
CONTRACT_TRAINING = """\
opts = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, mini_batch_size=128, max_epochs=10,
                               validation_data=val_ds, validation_frequency=30,
                               execution_environment="auto", plots="training-progress")
net, info = nbscale.train(model, train_ds, opts)           # loss: cross-entropy unless loss_fn= is given
"""


def first_python_block(page: Path) -> str:
    match = re.search(r"```python\n(.*?)```", page.read_text(), re.S)
    assert match, f"{page.name} has no python block"
    return match.group(1)


def in_digits_folder(kernel: KernelSession, folder: Path) -> None:
    write_digits_pngs(folder / "images")
    assert kernel.run(f"import os\nos.chdir({str(folder)!r})").ok


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_the_contracts_data_and_training_examples_train_on_image_folders(kernel: KernelSession, tmp_path) -> None:
    in_digits_folder(kernel, tmp_path)
    data = kernel.run(
        CONTRACT_DATA + "image, label = train_aug[0]\n"
        "print(len(ds), len(train_ds), len(val_ds), ds.classes, image.dtype, tuple(image.shape), label)"
    )
    assert data.ok, data.text
    assert "1797 1618 179 ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'] torch.float32 (1, 32, 32) 0" in data.stdout
    training = kernel.run(MODEL + CONTRACT_TRAINING, timeout=300)
    assert training.ok, training.text
    assert "Mini-batch Accuracy" in training.stdout and "Validation Accuracy" in training.stdout  # verbose's table
    assert any("image/png" in shown for shown in training.displays)  # the training-progress figure
    summary = kernel.run(
        "print(type(net).__name__, info.stop_reason, info.epoch[-1], "
        "info.final_validation_accuracy > 0.8, list(info.to_dataframe().columns))\nprint(info.hardware)"
    )
    assert summary.ok, summary.text
    assert (
        "Sequential Max epochs completed 10 True ['epoch', 'iteration', 'time', 'training_loss', "
        "'training_accuracy', 'validation_loss', 'validation_accuracy', 'learn_rate']"
    ) in summary.stdout
    assert re.search(r"^(CPU|GPU)", summary.stdout.splitlines()[-1]), summary.stdout  # "auto": a GPU if there is one


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_the_data_pages_example_runs_as_written_and_shows_its_montage(kernel: KernelSession, tmp_path) -> None:
    in_digits_folder(kernel, tmp_path)
    example = kernel.run(first_python_block(REPO_ROOT / "docs" / "data.md"))
    assert example.ok, example.text
    assert [shown for shown in example.displays if "image/png" in shown], "ds.preview(16) showed no montage"
    five_classes = kernel.run("print(five.classes, len(five), tuple(train_aug[0][0].shape))")
    assert "['5', '6', '7', '8', '9'] 896 (1, 32, 32)" in five_classes.stdout, five_classes.text


@pytest.mark.slow
def test_magic_lines_with_a_comment_after_them_run_as_the_docs_write_them(kernel: KernelSession) -> None:
    def run(code: str, timeout: float = 120) -> str:
        result = kernel.run(code, timeout=timeout)
        assert result.ok and "UsageError" not in result.stderr, result.text  # a bad magic line is a UsageError
        return result.text

    # pool.md's, API.md's and training.md's lines as they stand, comments included
    assert "Started 2 CPU workers" in run("%pool start 2 --cpu            # or: %pool start (one worker per free GPU)")
    assert "rank" in run(
        "%pool status               # a table: rank, host, pid, device, state (idle/busy/dead), memory"
    )
    assert run("%%spmd --targets 1   # rank 1 only\nprint(rank)").strip() == "[1] 1"
    run("import torch")
    trained = run(
        "%%train --env parallel --epochs 1 --batch-size 64 --lr 0.1 --no-plots     # also --options NAME\n"
        "model = torch.nn.Linear(8, 2)\ntrain_data = (torch.randn(128, 8), torch.randint(0, 2, (128,)))",
        timeout=180,
    )
    assert "Training on 2 workers" in trained
    assert "Restarted 2 CPU workers" in run("%pool restart              # same size and settings, fresh processes")
    assert "jobs" in run("%jobs                                  # id, name, state, started, elapsed")
    run("%gpu   # every GPU: index, name, memory, holder")
    assert run("%pool stop   # and its workers").strip() == "Pool stopped."
