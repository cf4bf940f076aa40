"""A labelled montage of images (what `preview(n)` shows): a PIL image, which notebooks display inline."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from PIL import Image, ImageDraw

TILE = 96  # pixels per tile side: small images are scaled up so the digits of an 8x8 image stay visible
CAPTION_HEIGHT = 14


def montage(images: Sequence[torch.Tensor], captions: Sequence[str], columns: int | None = None) -> Image.Image:
    """Tile float C x H x W images (values in [0, 1]) in a grid, each with its caption underneath."""
    columns = columns or max(1, min(8, math.ceil(math.sqrt(len(images)))))
    rows = max(1, math.ceil(len(images) / columns))
    sheet = Image.new("RGB", (columns * TILE, rows * (TILE + CAPTION_HEIGHT)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (image, caption) in enumerate(zip(images, captions, strict=True)):
        pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8)
        pixels = pixels.expand(3, -1, -1) if pixels.shape[0] == 1 else pixels[:3]
        tile = Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), "RGB")
        scale = TILE / max(tile.size)
        tile = tile.resize(
            (max(1, round(tile.width * scale)), max(1, round(tile.height * scale))),
            Image.Resampling.NEAREST if scale >= 2 else Image.Resampling.BILINEAR,
        )
        left, top = (k % columns) * TILE, (k // columns) * (TILE + CAPTION_HEIGHT)
        sheet.paste(tile, (left + (TILE - tile.width) // 2, top + (TILE - tile.height) // 2))
        draw.text((left + 3, top + TILE + 1), str(caption)[:16], fill="black")
    return sheet


def spread_over_classes(labels: Sequence[Hashable] | None, n: int) -> list[int]:
    """The indices of `n` items taken in turn from each class (the first of each class, then the second...).

    A montage of the first n items of a datastore sorted by folder shows one class only; this shows them all.
    Without labels: the first n items.
    """
    if labels is None:
        return list(range(n))
    members: dict[Hashable, list[int]] = {}
    for index, label in enumerate(labels):
        members.setdefault(label, []).append(index)
    chosen: list[int] = []
    for round_ in range(max((len(m) for m in members.values()), default=0)):
        chosen += [group[round_] for group in members.values() if round_ < len(group)]
        if len(chosen) >= n:
            break
    return chosen[:n]
