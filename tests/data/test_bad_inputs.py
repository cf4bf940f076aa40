"""Bad inputs to ImageDatastore, ImageAugmenter and AugmentedImageDatastore: each a one-paragraph error naming
the thing and the fix, never silently accepted, answered by internals, or slow."""

from __future__ import annotations

import os
import socket
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore
from nbscale.errors import DatastoreError, OptionsError


@pytest.fixture
def digits(digits_folder: Path) -> ImageDatastore:
    return ImageDatastore(digits_folder)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_subset_with_random_fractions_is_refused_not_truncated_to_image_0(digits):
    with pytest.raises(DatastoreError, match=r"whole item numbers .* not 0\.\d+ \(float"):
        digits.subset(np.random.default_rng(0).random(10))


def test_subset_with_float_indices_is_refused(digits):
    with pytest.raises(DatastoreError, match=r"not 1\.0 \(float\)"):
        digits.subset([1.0, 2.0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_augmenter_ranges_must_be_finite(bad):
    with pytest.raises(OptionsError, match="rand_rotation must be a .*finite numbers"):
        ImageAugmenter(rand_rotation=(0, bad))


@pytest.mark.parametrize("shift", [1e9, -1e9])
def test_augmenter_translations_beyond_any_image_are_refused(shift):
    with pytest.raises(OptionsError, match="more than 10000 pixels"):
        ImageAugmenter(rand_x_translation=(min(0, shift), max(0, shift)))


@pytest.mark.parametrize(
    "location, said",
    [(123, "is not a folder, file or URL"), (b"/path", "is bytes"), ([Path("/x"), 4.5], "4.5 is not a folder")],
)
def test_locations_that_are_no_path_are_named(location, said):
    with pytest.raises(DatastoreError, match=said):
        ImageDatastore(location)


@pytest.mark.parametrize("index", ["a", 1.5, True])
def test_items_are_asked_for_by_whole_numbers(digits, index):
    with pytest.raises(DatastoreError, match="asked for by its number"):
        digits[index]


def test_a_device_is_not_a_folder(tmp_path):
    with pytest.raises(DatastoreError, match="'/dev/null' is not a folder or an image file"):
        ImageDatastore("/dev/null")


def test_a_fifo_is_not_a_folder_and_is_not_opened(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(DatastoreError, match="is not a folder or an image file"):
        ImageDatastore(fifo)


def test_s3_without_a_bucket_says_to_name_one():
    with pytest.raises(DatastoreError, match="names no bucket"):
        ImageDatastore("s3://")


def test_an_unreachable_http_url_is_a_datastore_error_naming_it():
    url = f"http://127.0.0.1:{_closed_port()}/x"
    started = time.monotonic()
    with pytest.raises(DatastoreError, match=f"cannot list '{url}'.*reachable"):
        ImageDatastore(url)
    assert time.monotonic() - started < 15


def test_an_unreachable_s3_endpoint_is_a_datastore_error_within_seconds(monkeypatch):
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
    started = time.monotonic()
    with pytest.raises(DatastoreError, match="cannot list 's3://bucket/images'.*AWS_ENDPOINT_URL"):
        ImageDatastore("s3://bucket/images")
    assert time.monotonic() - started < 15  # was 15-19 s of retries, then a raw botocore error


@pytest.mark.parametrize("n", [-1, 0, 2.5])
def test_preview_needs_a_positive_count(digits, n):
    with pytest.raises(DatastoreError, match=f"n={n!r} must be a whole number of images, at least 1"):
        digits.preview(n)


def test_an_output_size_of_ten_billion_pixels_is_refused(digits):
    with pytest.raises(DatastoreError, match="10,000,000,000 pixels an image, more than the limit.*120.0 GB"):
        AugmentedImageDatastore((100000, 100000), digits)


def test_skipping_2000_unreadable_files_stops_soon_with_one_warning_and_a_clear_error(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for i in range(2000):
        (folder / f"{i:04}.png").write_bytes(b"")
    ds = ImageDatastore(tmp_path, on_error="skip")
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DatastoreError, match="100 files in a row cannot be read as images"):
            ds[0]
    assert time.monotonic() - started < 10
    assert len(caught) == 1 and "skipped 100 unreadable" in str(caught[0].message)


def test_skipping_a_few_unreadable_files_still_reads_the_next_good_one(tmp_path, digits_folder):
    folder = tmp_path / "0"
    folder.mkdir()
    for i in range(5):
        (folder / f"a{i}.png").write_bytes(b"")
    (folder / "b.png").write_bytes(next(Path(digits_folder, "0").iterdir()).read_bytes())
    ds = ImageDatastore(tmp_path, on_error="skip")
    with pytest.warns(UserWarning, match=r"skipped 5 unreadable image\(s\) \(5 so far"):
        assert tuple(ds[0][0].shape) == (1, 8, 8)


def test_numpy_and_torch_integers_still_ask_for_items(digits):
    import torch

    first = digits[3][0]
    assert digits[np.int64(3)][0].equal(first) and digits[torch.tensor(3)][0].equal(first)
