"""Decompression bombs: a small file whose header claims a huge image is refused before any pixel is decoded."""

from __future__ import annotations

import io
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nbscale.data import ImageDatastore
from nbscale.errors import DatastoreError

MB = 2**20


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _claiming(width: int, height: int) -> bytes:
    """An 8 x 8 PNG whose IHDR (with a valid CRC) claims width x height pixels."""
    data = bytearray(_png(8, 8))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


@pytest.fixture
def bomb_folder(tmp_path: Path) -> Path:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bomb.png").write_bytes(_claiming(25000, 25000))
    (tmp_path / "a" / "fine.png").write_bytes(_png(16, 16))
    return tmp_path


def test_a_png_claiming_25000_squared_pixels_is_refused_naming_the_file_the_limit_and_the_variable(bomb_folder):
    ds = ImageDatastore(bomb_folder)
    _reset_peak()
    started = time.monotonic()
    with pytest.raises(DatastoreError) as refused:
        ds[0]
    assert time.monotonic() - started < 5  # 2.5 GB were never decoded
    message = str(refused.value)
    assert "bomb.png" in message and "25000 x 25000" in message and "100,000,000" in message
    assert "NBSCALE_MAX_IMAGE_PIXELS" in message


def test_refusing_a_bomb_keeps_memory_small(bomb_folder):
    ds = ImageDatastore(bomb_folder)
    ImageDatastore(bomb_folder, on_error="skip")[1]  # imports and decoders loaded before the measure
    _reset_peak()
    before = _peak_rss()
    with pytest.raises(DatastoreError):
        ds[0]
    assert _peak_rss() - before < 32 * MB


def test_under_on_error_skip_a_bomb_is_skipped_like_an_unreadable_file(bomb_folder):
    ds = ImageDatastore(bomb_folder, on_error="skip")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        image, _ = ds[0]
    assert tuple(image.shape) == (3, 16, 16)
    assert ds.skipped_files == {str(bomb_folder / "a" / "bomb.png")}


def test_the_pixel_limit_is_set_by_nbscale_max_image_pixels(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "wide.png").write_bytes(_png(100, 60))
    ds = ImageDatastore(tmp_path)
    monkeypatch.setenv("NBSCALE_MAX_IMAGE_PIXELS", "5000")
    with pytest.raises(DatastoreError, match=r"100 x 60 = 6,000 pixels, more than the limit of 5,000"):
        ds[0]
    monkeypatch.setenv("NBSCALE_MAX_IMAGE_PIXELS", "6000")
    assert tuple(ds[0][0].shape) == (3, 60, 100)


def test_a_pixel_limit_that_is_no_number_is_named(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.png").write_bytes(_png(4, 4))
    monkeypatch.setenv("NBSCALE_MAX_IMAGE_PIXELS", "lots")
    with pytest.raises(DatastoreError, match="NBSCALE_MAX_IMAGE_PIXELS='lots' is not a positive whole number"):
        ImageDatastore(tmp_path)[0]


def test_reading_a_normal_image_is_not_warned_about(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.png").write_bytes(_png(32, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuple(ImageDatastore(tmp_path)[0][0].shape) == (3, 32, 32)


def test_a_gif_claiming_30000_squared_pixels_is_refused_through_pillows_header_reading(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(buffer, format="GIF")
    data = bytearray(buffer.getvalue())
    data[6:10] = struct.pack("<HH", 30000, 30000)  # the logical screen size
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bomb.gif").write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="bomb.gif.*30000 x 30000"):
        ImageDatastore(tmp_path)[0]
