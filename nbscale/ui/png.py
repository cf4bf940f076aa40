"""A matplotlib Agg canvas as a PNG, written here with zlib: a live figure is encoded every draw, and Pillow's PNG
writer spends most of its time choosing a row filter per row (3.7 ms for a 648x374 figure, against 1.8 ms here,
with no filter and zlib's fastest level: a few percent larger)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_RGB = 2  # the PNG colour type of 8-bit RGB


def canvas_png(canvas: Any) -> bytes:
    """The canvas' pixels as an 8-bit RGB PNG (its alpha dropped: the figure is opaque)."""
    import numpy as np

    width, height = canvas.get_width_height(physical=True)
    pixels = np.asarray(canvas.buffer_rgba())[:, :, :3]
    rows = np.zeros((height, 1 + 3 * width), dtype=np.uint8)  # each row: filter type 0 (none), then its pixels
    rows[:, 1:] = pixels.reshape(height, 3 * width)
    header = struct.pack(">IIBBBBB", width, height, 8, _RGB, 0, 0, 0)
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.data, 1)) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
