"""Real image files for tests and examples: scikit-learn's digits as PNG class folders, its sample photos as JPEG."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image


def write_digits_pngs(
    folder: Path | str, classes: Iterable[int] = range(10), limit_per_class: int | None = None, size: int | None = None
) -> Path:
    """Write scikit-learn's 8x8 digits as grayscale PNGs in one folder per class (`folder/3/0042.png`).

    `size` scales each image up (nearest) to size x size; returns `folder`.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder = Path(folder)
    wanted = set(classes)
    written: dict[int, int] = {}
    for index, (image, target) in enumerate(zip(digits.images, digits.target, strict=True)):
        target = int(target)
        if target not in wanted or (limit_per_class is not None and written.get(target, 0) >= limit_per_class):
            continue
        pixels = Image.fromarray(np.round(image * 255 / 16).astype(np.uint8), "L")
        if size is not None:
            pixels = pixels.resize((size, size), Image.NEAREST)
        (folder / str(target)).mkdir(parents=True, exist_ok=True)
        pixels.save(folder / str(target) / f"{index:04d}.png")
        written[target] = written.get(target, 0) + 1
    return folder


def write_sample_jpegs(folder: Path | str, size: tuple[int, int] | None = (64, 48)) -> Path:
    """Write scikit-learn's two sample photos (china, flower) as RGB JPEGs in class folders; returns `folder`."""
    from sklearn.datasets import load_sample_images

    samples = load_sample_images()
    folder = Path(folder)
    for name, image in zip(samples.filenames, samples.images, strict=True):
        label = Path(name).stem
        picture = Image.fromarray(image)
        if size is not None:
            picture = picture.resize(size, Image.BILINEAR)
        (folder / label).mkdir(parents=True, exist_ok=True)
        picture.save(folder / label / f"{label}.jpg", quality=95)
    return folder
