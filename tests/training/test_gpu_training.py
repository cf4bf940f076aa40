"""Training on a real CUDA GPU (run where one is visible; skipped elsewhere): "multi-gpu" on a GPU pool with NCCL,
and a real out-of-memory in the notebook's process and on a worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import nbscale
from nbscale import TrainingOptions, WorkerError
from tests.training.digits import ViewsItsFeatures, digits, tiny_net

TRAIN, VAL = digits()

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def options(**fields: object) -> TrainingOptions:
    base = {
        "initial_learn_rate": 0.1,
        "max_epochs": 6,
        "mini_batch_size": 64,
        "verbose": False,
        "validation_data": VAL,
        "validation_frequency": 20,
    }
    return TrainingOptions("sgdm", **{**base, **fields})


def memory_hungry_net() -> nn.Module:
    """A net for 8x8 digits that upsamples each image 512-fold first: a mini-batch of 4096 needs ~275 GB."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Upsample(scale_factor=512),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


@pytest.fixture(scope="module")
def gpu_pool() -> Iterator[nbscale.Pool]:
    with nbscale.Pool(gpus=list(range(torch.cuda.device_count()))) as started:
        yield started


def test_real_out_of_memory_in_the_notebook_names_the_gpu_and_mini_batch_and_frees_it() -> None:
    with pytest.raises(torch.OutOfMemoryError) as caught:
        nbscale.train(memory_hungry_net(), TRAIN, options(execution_environment="gpu", mini_batch_size=4096))
    message = str(caught.value)
    assert (
        "Out of GPU memory training on cuda:0" in message and "mini_batch_size=1500: lower mini_batch_size" in message
    )
    assert caught.value.__traceback__ is not None and torch.cuda.memory_allocated() < 2**30  # nothing held
    _, info = nbscale.train(tiny_net(), TRAIN, options(execution_environment="gpu", max_epochs=2))
    assert info.stop_reason == "Max epochs completed"  # the GPU is usable again


def test_multi_gpu_trains_digits_with_nccl_like_one_process(gpu_pool: nbscale.Pool) -> None:
    torch.manual_seed(1)
    alone, _ = nbscale.train(tiny_net(), TRAIN, options(execution_environment="gpu"))
    torch.manual_seed(1)
    net, info = nbscale.train(tiny_net(), TRAIN, options(execution_environment="multi-gpu"))
    assert info.final_validation_accuracy >= 0.9 and info.stop_reason == "Max epochs completed"
    assert "NCCL" in info.hardware and "cuda:0" in info.hardware
    assert next(net.parameters()).device.type == "cpu"  # the trained weights come back to the notebook
    assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(alone.cpu().parameters(), net.parameters(), strict=True))


def test_real_out_of_memory_on_a_gpu_worker_names_it_and_the_pool_stays_usable(gpu_pool: nbscale.Pool) -> None:
    with pytest.raises(WorkerError, match="Out of GPU memory on worker 0") as caught:
        nbscale.train(memory_hungry_net(), TRAIN, options(execution_environment="multi-gpu", mini_batch_size=4096))
    assert "lower mini_batch_size" in str(caught.value)
    _, info = nbscale.train(tiny_net(), TRAIN, options(execution_environment="multi-gpu", max_epochs=1))
    assert info.stop_reason == "Max epochs completed"


def test_mixed_precision_trains_conv_nets_channels_last_and_gives_them_back_in_nchw() -> None:
    torch.manual_seed(0)
    conv = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 64, 10),
    )
    layouts = []
    conv[3].register_forward_pre_hook(lambda module, args: layouts.append(module.weight.is_contiguous()))
    net, info = nbscale.train(conv, TRAIN, options(execution_environment="gpu", precision="mixed"))
    assert False in layouts and net[3].weight.is_contiguous()  # trained in channels_last, given back in NCHW
    assert info.final_validation_accuracy >= 0.85
    _, info = nbscale.train(ViewsItsFeatures(), TRAIN, options(execution_environment="gpu", precision="mixed"))
    assert info.final_validation_accuracy >= 0.85  # trained in NCHW: .view needs it


def test_an_augmented_epoch_on_the_gpu_waits_for_it_only_at_the_bunched_reads() -> None:
    """Batches, augmentation draws and the step queue on the GPU without a host synchronisation: only the reads
    of the figures (every 25 iterations, 0.2 s, or an epoch's end) wait for it. Per-batch index copies from
    pageable memory or offsets read back to size a padding would make it wait every iteration."""
    import warnings

    from nbscale.data import AugmentedImageDatastore, ImageAugmenter

    images = (TRAIN[0].view(-1, 1, 8, 8) * 255).to(torch.uint8).repeat(2, 3, 1, 1)
    labels = TRAIN[1].repeat(2)
    data = AugmentedImageDatastore(
        (8, 8),
        torch.utils.data.TensorDataset(images, labels),
        ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-2, 2), rand_y_translation=(-2, 2)),
    )
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 64, 10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _, info = nbscale.train(
                model,
                data,
                options(execution_environment="gpu", validation_data=None, mini_batch_size=32, max_epochs=4),
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [w for w in caught if "synchroniz" in str(w.message).lower()]
    iterations = info.iteration[-1]
    assert iterations == 4 * (3000 // 32) and len(waits) < iterations / 4, (len(waits), iterations)
