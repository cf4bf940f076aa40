"""Data benchmarks, side by side in one run, on a folder of 32x32 PNGs written from scikit-learn's sample photos.

1. Read + decode + augment (random crop with padding 4, horizontal flip): images/s of nbscale's
   AugmentedImageDatastore in a DataLoader with background workers vs torchvision's ImageFolder with the same
   transforms and the same worker count.
2. One training epoch of a small CNN with the data device-resident (decoded once, augmented per batch) vs
   streamed through a DataLoader, on the CPU (and on the GPU when there is one).
3. nbscale.train on the same AugmentedImageDatastore: "cpu" in this process vs "parallel" on a pool of
   WORKERS CPU workers on the same cores (images/s of training time, as info reports it).

Run: `python bench/bench_data.py` (prints a markdown section). `bench/run_all.py` collects `run()`.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

IMAGES = 4000
CLASSES = 10
WORKERS = min(2, os.cpu_count() or 1)
BATCH = 128
PASSES = 3


def write_pngs(folder: Path) -> Path:
    """IMAGES random 32x32 crops of the two sample photos, as RGB PNGs in CLASSES folders."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        photo = photos[i % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - 64), rng.integers(0, photo.shape[1] - 64)
        crop = Image.fromarray(photo[top : top + 64, left : left + 64]).resize((32, 32), Image.BILINEAR)
        target = folder / f"class{i % CLASSES}"
        target.mkdir(parents=True, exist_ok=True)
        crop.save(target / f"{i:05d}.png")
    return folder


def images_per_second(dataset: torch.utils.data.Dataset) -> float:
    """Best of PASSES full passes through a shuffling DataLoader with WORKERS persistent workers."""
    loader = DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True, prefetch_factor=4
    )
    best = float("inf")
    for _ in range(PASSES):
        started = time.perf_counter()
        count = sum(len(labels) for _, labels in loader)
        best = min(best, time.perf_counter() - started)
    return count / best


def nbscale_dataset(folder: Path) -> torch.utils.data.Dataset:
    from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore

    augmenter = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-4, 4), rand_y_translation=(-4, 4))
    return AugmentedImageDatastore((32, 32), ImageDatastore(folder), augmenter=augmenter)


def torchvision_dataset(folder: Path) -> torch.utils.data.Dataset:
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor()]
    )
    return datasets.ImageFolder(str(folder), transform=transform)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def epoch_seconds(batches, device: torch.device) -> float:
    """Seconds for one epoch of SGD over `batches()` (an iterable factory of (images, labels))."""
    torch.manual_seed(0)
    model = small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def one_epoch() -> None:
        for images, labels in batches():
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    one_epoch()  # warm-up: workers started, kernels chosen
    started = time.perf_counter()
    one_epoch()
    return time.perf_counter() - started


def placement_rows(dataset: torch.utils.data.Dataset) -> list[str]:
    from nbscale.data.device_resident import DeviceResidentData

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        loader = DataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
            pin_memory=device.type == "cuda",
        )
        stream = epoch_seconds(lambda loader=loader: loader, device)
        resident = DeviceResidentData(dataset, device)
        on_device = epoch_seconds(lambda resident=resident: resident.batches(BATCH, shuffle=True), device)
        rows.append(f"| {device.type} | {stream:.2f} | {on_device:.2f} | {stream / on_device:.2f}x |")
    return rows


def notebook_vs_pool_rows(folder: Path) -> list[str]:
    """nbscale.train "cpu" here vs "parallel" on a pool of WORKERS CPU workers, best of two runs each."""
    import nbscale

    options = nbscale.TrainingOptions(
        "sgdm", initial_learn_rate=0.05, mini_batch_size=BATCH, max_epochs=3, verbose=False
    )
    rates: dict[str, float] = {"cpu": 0.0, "parallel": 0.0}
    with nbscale.Pool(WORKERS, cpu=True):
        for _ in range(2):
            for environment in rates:
                torch.manual_seed(0)
                _, info = nbscale.train(
                    small_cnn(), nbscale_dataset(folder), options.replace(execution_environment=environment)
                )
                rates[environment] = max(rates[environment], info.images_per_second)
    return [
        f'| nbscale.train, "cpu" in the notebook\'s process | {rates["cpu"]:,.0f} |',
        f'| nbscale.train, "parallel" on {WORKERS} CPU workers | {rates["parallel"]:,.0f} |',
        f"| ratio notebook / pool | {rates['cpu'] / rates['parallel']:.2f}x |",
    ]


def run() -> str:
    """Run both benchmarks and return the markdown section."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory() as scratch:
        folder = write_pngs(Path(scratch) / "pngs")
        ours = images_per_second(nbscale_dataset(folder))
        theirs = images_per_second(torchvision_dataset(folder))
        placement = placement_rows(nbscale_dataset(folder))
        notebook_vs_pool = notebook_vs_pool_rows(folder)
    lines = [
        "## Data: read + decode + augment, and device-resident training",
        "",
        f"{IMAGES} RGB PNGs of 32x32, random crop with padding 4 + horizontal flip, batches of {BATCH}, "
        f"{WORKERS} DataLoader workers each, best of {PASSES} passes ({os.cpu_count()} CPU cores).",
        "",
        "| loader | images/s |",
        "|---|---|",
        f"| nbscale AugmentedImageDatastore | {ours:,.0f} |",
        f"| torchvision ImageFolder | {theirs:,.0f} |",
        f"| ratio nbscale / torchvision | {ours / theirs:.2f}x |",
        "",
        f"One epoch of a small CNN on the same {IMAGES} images (same augmentation):",
        "",
        f"| device | streamed ({WORKERS} workers), s | device-resident, s | speed-up |",
        "|---|---|---|---|",
        *placement,
        "",
        "Training the small CNN for 3 epochs on the same datastore, whole images/s of training time:",
        "",
        "| run | images/s |",
        "|---|---|",
        *notebook_vs_pool,
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
