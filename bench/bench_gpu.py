"""GPU training: nbscale.train against the loop a user would write by hand, in the same run (issue 13).

Rows, each nbscale against its own hand-written peer with the same network, data, recipe and precision:
1. airbench94-class network (airbench's published architecture, written here), 50,000 synthetic 32x32 uint8
   images, random flip + 2-pixel translation, mini-batch 1024, bf16 autocast + channels_last, 8 epochs:
   `AugmentedImageDatastore` + `ImageAugmenter`, precision="mixed", data_placement="device" against a hand loop
   with the data on the GPU and the augmentation done on the GPU on the whole dataset each epoch (airbench's way);
2. the same without augmentation, from a float TensorDataset;
3. row 1 with compile=True against the hand loop with torch.compile;
4. torchvision ResNet-50 at 224x224, mini-batch 256, bf16, synthetic float data;
5. row 4 with execution_environment="parallel" on a pool of one GPU worker, against row 4's nbscale in the notebook's
   process (the peer here is nbscale itself: the pool's cost over training in-process);
6. "display": row 1's nbscale run in a real Jupyter kernel with plots="training-progress" (the live figure and info
   panel, drawn in the kernel) against plots="none" in the same kernel, over DISPLAY_EPOCHS so that the figure
   updates during training (issue 13.4: the display costs at most 1%). It needs the kernel's packages (ipykernel,
   jupyter_client, ipywidgets) and is left out, saying so, where they are missing.

The recipe is one nbscale can express, so both sides run the same update: SGD with momentum 0.9 (not Nesterov),
a constant learn rate, cross-entropy, and MATLAB's L2 regularisation (weight decay 1e-4 on every parameter except
biases, whose names end in "bias": BiasL2Factor 0). Hand loops set `cudnn.benchmark` and read the loss once an
epoch. Whole calls are timed (data moved to the GPU, network built, compiled where asked, trained, and for
nbscale the weights copied back), after one warm-up call of each side; runs alternate (nbscale, hand, nbscale,
...), and the table gives the median of each side, the median of the pairs' ratios and each side's best.

Run on a GPU machine: `python bench/bench_gpu.py` (a markdown table; `make bench` runs it where CUDA is visible).
BENCH_GPU_ON_CPU=1 runs every row on the CPU at a tiny size (single precision, a pool of one CPU worker) to check
the code; BENCH_GPU_REPEATS (default 5) and BENCH_GPU_ROWS (e.g. "airbench,resnet,parallel,compile,display") choose
more; BENCH_GPU_DISPLAY_EPOCHS sets the display row's epochs and
BENCH_GPU_PARALLEL_EPOCHS the parallel row's, one row per count on one pool (e.g. "5,20"; rows after the first
skip the warm-up).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ON_CPU = os.environ.get("BENCH_GPU_ON_CPU") == "1"
REPEATS = int(os.environ.get("BENCH_GPU_REPEATS", 1 if ON_CPU else 5))
ROWS = os.environ.get("BENCH_GPU_ROWS", "airbench,plain,compile,resnet,parallel,display").split(",")
DISPLAY_EPOCHS = int(os.environ.get("BENCH_GPU_DISPLAY_EPOCHS", 1 if ON_CPU else 24))  # long enough to redraw


@dataclass(frozen=True)
class Sizes:
    images: int  # airbench-class rows
    batch: int
    epochs: int
    resnet_images: int
    resnet_side: int
    resnet_batch: int
    resnet_epochs: int


SIZES = (
    Sizes(images=2048, batch=256, epochs=1, resnet_images=32, resnet_side=64, resnet_batch=16, resnet_epochs=1)
    if ON_CPU
    else Sizes(
        images=50_000, batch=1024, epochs=8, resnet_images=1536, resnet_side=224, resnet_batch=256, resnet_epochs=5
    )
)
DEVICE = torch.device("cpu" if ON_CPU else "cuda")
PRECISION = "single" if ON_CPU else "mixed"  # "mixed" is bf16 autocast on the GPU
LEARN_RATE, MOMENTUM, L2 = 0.05, 0.9, 1e-4
COMPILE_SECONDS: list[float] = []  # info.compile_seconds of each nbscale call (0 where not compiled)


def airbench_class_net() -> nn.Module:
    """airbench94's architecture: a 2x2 'whitening' convolution to 24 channels, three groups of two 3x3
    convolutions (64, 256, 256 channels) with max-pooling, BatchNorm and GELU, a 3x3 max-pool and a linear head.
    torch's default initialisation (airbench's whitening and identity initialisations change accuracy, not speed)."""

    def group(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, padding=1, bias=False),
            nn.MaxPool2d(2),
            nn.BatchNorm2d(outputs),
            nn.GELU(),
            nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.GELU(),
        )

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 24, 2),
        nn.GELU(),
        group(24, 64),
        group(64, 256),
        group(256, 256),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(256, 10, bias=False),
    )


def resnet50() -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(num_classes=1000)


# ---- the hand-written loop ----------------------------------------------------------------------------------------


def matlab_l2_groups(model: nn.Module) -> list[dict]:
    """L2 on every parameter but biases, as nbscale's sgdm applies MATLAB's L2Regularization."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for name, p in named if not name.endswith("bias")], "weight_decay": L2},
        {"params": [p for name, p in named if name.endswith("bias")], "weight_decay": 0.0},
    ]


def flip_and_translate(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Each image flipped left-right with probability 1/2, then moved by up to `pad` pixels each way (zeros
    come in): the whole dataset at once on the GPU, random values drawn there."""
    n, _, h, w = images.shape
    device = images.device
    flip = torch.rand(n, device=device) < 0.5
    images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    padded = F.pad(images, (pad, pad, pad, pad))
    top, left = torch.randint(0, 2 * pad + 1, (2, n), device=device)
    rows = top[:, None] + torch.arange(h, device=device)
    cols = left[:, None] + torch.arange(w, device=device)
    picked = padded[torch.arange(n, device=device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return picked.permute(0, 3, 1, 2)  # N x C x H x W, stored channels_last


def hand_loop(
    make_model: Callable[[], nn.Module],
    images: torch.Tensor,
    labels: torch.Tensor,
    batch: int,
    epochs: int,
    augment: bool,
    compile_model: bool = False,
) -> int:
    """Train as a user would by hand; returns the images trained on. `images` are uint8 (scaled here) or float."""
    torch.backends.cudnn.benchmark = DEVICE.type == "cuda"
    try:
        return _hand_loop(make_model, images, labels, batch, epochs, augment, compile_model)
    finally:
        torch.backends.cudnn.benchmark = False


def _hand_loop(
    make_model: Callable[[], nn.Module],
    images: torch.Tensor,
    labels: torch.Tensor,
    batch: int,
    epochs: int,
    augment: bool,
    compile_model: bool,
) -> int:
    model = make_model().to(DEVICE)
    mixed = PRECISION == "mixed"
    if mixed:
        model = model.to(memory_format=torch.channels_last)
    net = torch.compile(model) if compile_model else model
    optimizer = torch.optim.SGD(matlab_l2_groups(model), lr=LEARN_RATE, momentum=MOMENTUM)
    data = images.to(DEVICE)
    data = data.float().div_(255) if data.dtype == torch.uint8 else data
    targets = labels.to(DEVICE)
    steps = len(data) // batch
    for _ in range(epochs):
        epoch_data = flip_and_translate(data, 2) if augment else data
        order = torch.randperm(len(data), device=DEVICE)
        for i in range(steps):
            index = order[i * batch : (i + 1) * batch]
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=mixed):
                loss = F.cross_entropy(net(epoch_data[index]), targets[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        loss.item()  # the epoch's last loss, as a progress print would read it
    return steps * batch * epochs


# ---- nbscale ------------------------------------------------------------------------------------------------------


def nbscale_train(
    make_model: Callable[[], nn.Module],
    data: object,
    batch: int,
    epochs: int,
    environment: str | None = None,
    plots: str = "none",
    **fields: object,
) -> int:
    import nbscale

    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=LEARN_RATE,
        momentum=MOMENTUM,
        l2_regularization=L2,
        mini_batch_size=batch,
        max_epochs=epochs,
        shuffle="every-epoch",
        precision=PRECISION,
        plots=plots,
        verbose=False,
        execution_environment=environment or DEVICE.type.replace("cuda", "gpu"),
        **fields,
    )
    _, info = nbscale.train(make_model(), data, options)
    COMPILE_SECONDS.append(info.compile_seconds)
    return info.iteration[-1] * batch


def augmented_store(images: torch.Tensor, labels: torch.Tensor) -> object:
    from nbscale.data import AugmentedImageDatastore, ImageAugmenter

    augmenter = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-2, 2), rand_y_translation=(-2, 2))
    return AugmentedImageDatastore(tuple(images.shape[-2:]), TensorDataset(images, labels), augmenter)


def _epochs(count: int) -> str:
    return f"{count} epoch{'s' * (count != 1)}"


# ---- in a real kernel ---------------------------------------------------------------------------------------------

KERNEL_SETUP = """
import sys
sys.path.insert(0, {repo!r})
import torch
from bench.bench_gpu import airbench_class_net, augmented_store, nbscale_train
generator = torch.Generator().manual_seed(0)
images = torch.randint(0, 256, ({images}, 3, 32, 32), dtype=torch.uint8, generator=generator)
labels = torch.randint(0, 10, ({images},), generator=generator)
"""

KERNEL_RUN = """trained = nbscale_train(airbench_class_net, augmented_store(images, labels), {batch}, {epochs},
                        plots={plots!r}, data_placement="device")"""


def display_pairs(size: Sizes, runs: dict[str, list[float]]) -> str:
    """Row 6: the airbench-class nbscale run in a real kernel, the live figure and info panel on against off."""
    label = (
        f"airbench94-class with augmentation, {_epochs(DISPLAY_EPOCHS)}, in a real kernel: plots="
        "'training-progress' vs plots='none'"
    )
    try:
        from tests.kernel_session import KernelSession

        kernel = KernelSession()
    except ImportError as missing:
        return f"| {label} | not run: {missing} (the kernel's packages) | | | |"
    updates: list[int] = []

    def in_kernel(plots: str) -> Callable[[], int]:
        def trained() -> int:
            result = kernel.run(KERNEL_RUN.format(batch=size.batch, epochs=DISPLAY_EPOCHS, plots=plots), timeout=600)
            if not result.ok:
                raise RuntimeError(result.text)
            if plots != "none":  # figure updates between the empty figure before training and the final one
                updates.append(sum("image/png" in shown for shown in result.displays) - 2)
            return int(kernel.run("print(trained)").stdout)

        return trained

    try:
        setup = kernel.run(KERNEL_SETUP.format(repo=str(Path(__file__).resolve().parent.parent), images=size.images))
        if not setup.ok:
            raise RuntimeError(setup.text)
        row = pairs("display", label, in_kernel("training-progress"), in_kernel("none"), runs)
    finally:
        kernel.shutdown()
    return row.replace(label, f"{label}; the figure updated {min(updates)}-{max(updates)} times during each run", 1)


# ---- measuring ----------------------------------------------------------------------------------------------------


def images_per_second(run: Callable[[], int]) -> float:
    """Images trained per second of the whole call (the GPU's queue drained before and after)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    images = run()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    return images / (time.perf_counter() - started)


def pairs(
    key: str,
    label: str,
    ours: Callable[[], int],
    peer: Callable[[], int],
    runs: dict[str, list[float]],
    warm_up: bool = True,
) -> str:
    """Warm each side up once (unless a row before warmed up the same code), then REPEATS alternating pairs; the
    table row (`key` names the row's runs)."""
    if warm_up:
        ours(), peer()
    mine, theirs = runs.setdefault(f"{key} nbscale", []), runs.setdefault(f"{key} peer", [])
    for _ in range(REPEATS):
        mine.append(images_per_second(ours))
        theirs.append(images_per_second(peer))
        print(f"{key}: nbscale {mine[-1]:,.0f}, peer {theirs[-1]:,.0f} images/s", file=sys.stderr, flush=True)
    ratio = statistics.median(a / b for a, b in zip(mine, theirs, strict=True))
    return (
        f"| {label} | {statistics.median(mine):,.0f} | {statistics.median(theirs):,.0f} | {ratio:.3f}x | "
        f"{max(mine):,.0f} / {max(theirs):,.0f} |"
    )


def run() -> str:
    """Measure and return the markdown section ("" where no GPU is visible and BENCH_GPU_ON_CPU is not set)."""
    if not (ON_CPU or torch.cuda.is_available()):
        return ""
    size = SIZES
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (size.images, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (size.images,), generator=generator)
    floats = images.float() / 255
    side = size.resnet_side
    resnet_images = torch.randn(size.resnet_images, 3, side, side, generator=generator)
    resnet_labels = torch.randint(0, 1000, (size.resnet_images,), generator=generator)
    rows, runs = [], {}
    batch, epochs = size.batch, size.epochs
    if "airbench" in ROWS:
        rows.append(
            pairs(
                "airbench",
                f"airbench94-class, {size.images:,} 32x32 uint8, flip + translate 2, mini-batch {batch}, "
                f"{_epochs(epochs)}",
                lambda: nbscale_train(
                    airbench_class_net, augmented_store(images, labels), batch, epochs, data_placement="device"
                ),
                lambda: hand_loop(airbench_class_net, images, labels, batch, epochs, augment=True),
                runs,
            )
        )
    if "plain" in ROWS:
        rows.append(
            pairs(
                "plain",
                "same without augmentation (float TensorDataset)",
                lambda: nbscale_train(
                    airbench_class_net, TensorDataset(floats, labels), batch, epochs, data_placement="device"
                ),
                lambda: hand_loop(airbench_class_net, floats, labels, batch, epochs, augment=False),
                runs,
            )
        )
    if "compile" in ROWS:
        COMPILE_SECONDS.clear()
        rows.append(
            pairs(
                "compile",
                "airbench94-class with augmentation, compile=True vs torch.compile by hand",
                lambda: nbscale_train(
                    airbench_class_net,
                    augmented_store(images, labels),
                    batch,
                    epochs,
                    data_placement="device",
                    compile=True,
                ),
                lambda: hand_loop(airbench_class_net, images, labels, batch, epochs, augment=True, compile_model=True),
                runs,
            ).replace(
                "compile=True vs torch.compile by hand",
                "compile=True vs torch.compile by hand, compiling included (nbscale's compile_seconds a call: "
                f"median {statistics.median(COMPILE_SECONDS):.2f} s)",
                1,
            )
        )
    resnet_data = TensorDataset(resnet_images, resnet_labels)
    resnet_batch, resnet_epochs = size.resnet_batch, size.resnet_epochs
    in_process = lambda: nbscale_train(resnet50, resnet_data, resnet_batch, resnet_epochs)  # noqa: E731
    if "resnet" in ROWS:
        rows.append(
            pairs(
                "resnet",
                f"ResNet-50, {size.resnet_images:,} {side}x{side} float, mini-batch {resnet_batch}, "
                f"{_epochs(resnet_epochs)}",
                in_process,
                lambda: hand_loop(resnet50, resnet_images, resnet_labels, resnet_batch, resnet_epochs, augment=False),
                runs,
            )
        )
    if "parallel" in ROWS:
        import nbscale

        counts = [int(n) for n in os.environ.get("BENCH_GPU_PARALLEL_EPOCHS", str(resnet_epochs)).split(",")]
        with nbscale.Pool(1, cpu=True) if ON_CPU else nbscale.Pool(gpus=[0]):
            for index, count in enumerate(counts):
                rows.append(
                    pairs(
                        f"parallel {count}",
                        f"ResNet-50 as above, {_epochs(count)}, execution_environment='parallel' on a "
                        "pool of 1 vs nbscale in-process",
                        lambda count=count: nbscale_train(resnet50, resnet_data, resnet_batch, count, "parallel"),
                        lambda count=count: nbscale_train(resnet50, resnet_data, resnet_batch, count),
                        runs,
                        warm_up=index == 0,
                    )
                )
    if "display" in ROWS:
        rows.append(display_pairs(size, runs))
    name = "CPU (BENCH_GPU_ON_CPU=1: tiny sizes, a code check only)" if ON_CPU else torch.cuda.get_device_name(0)
    return "\n".join(
        [
            "## GPU training vs hand-written loops (bench/bench_gpu.py)",
            "",
            f"{name}, torch {torch.__version__}, {'single precision' if ON_CPU else 'bf16 autocast + channels_last'}; "
            f"whole calls timed, {REPEATS} alternating pairs after a warm-up of each; SGD momentum 0.9, L2 1e-4 on "
            "weights only (MATLAB's), constant learn rate.",
            "",
            "| run | nbscale images/s (median) | peer images/s (median) | median pair ratio "
            "| best nbscale / best peer |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            "Every run (images/s): "
            + "; ".join(f"{name} {', '.join(f'{v:,.0f}' for v in values)}" for name, values in runs.items()),
            "",
        ]
    )


if __name__ == "__main__":
    print(run())
