"""The device-resident path: decoded once, batches cut on the device, augmentation applied per batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore
from nbscale.data.device_resident import DeviceResidentData, fits_on_device
from tests.datasets import write_digits_pngs

CPU = torch.device("cpu")


def test_images_match_the_datastore_and_are_kept_as_uint8(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder).subset(range(0, 1797, 7))
    resident = DeviceResidentData(ds, CPU)
    assert len(resident) == len(ds) and resident.images.dtype == torch.uint8
    images, labels = next(resident.batches(len(ds), shuffle=False))
    assert torch.equal(images[5], ds[5][0]) and labels[5] == ds[5][1] and images.dtype == torch.float32
    assert resident.description.startswith(f"device-resident ({len(ds)} images,") and "on cpu" in resident.description


def test_batches_cover_every_item_once_and_shuffle_repeats_with_a_seed(digits_folder: Path) -> None:
    resident = DeviceResidentData(ImageDatastore(digits_folder / "4"), CPU)
    sizes = [len(y) for _, y in resident.batches(50, shuffle=True, generator=torch.Generator().manual_seed(1))]
    assert sum(sizes) == len(resident) and sizes[:-1] == [50] * (len(sizes) - 1)
    first = [x for x, _ in resident.batches(50, shuffle=True, generator=torch.Generator().manual_seed(1))]
    again = [x for x, _ in resident.batches(50, shuffle=True, generator=torch.Generator().manual_seed(1))]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert [len(y) for _, y in resident.batches(50, shuffle=False, drop_last=True)] == [50] * (len(resident) // 50)


def test_indices_restrict_the_pass_to_a_shard_in_order(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    resident = DeviceResidentData(ds, CPU)
    shard = torch.tensor([1700, 3, 900])
    _, labels = next(resident.batches(10, shuffle=False, indices=shard))
    assert labels.tolist() == [ds[1700][1], ds[3][1], ds[900][1]]


def test_augmented_datastore_is_stored_unaugmented_and_augmented_per_batch(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder).subset([10] * 64)
    ds = AugmentedImageDatastore((12, 12), source, ImageAugmenter(rand_x_reflection=True))
    resident = DeviceResidentData(ds, CPU)
    assert resident.images.shape == (64, 1, 8, 8)  # the source size: augmentation, then sizing, per batch
    images, _ = next(resident.batches(64, shuffle=False))
    plain = AugmentedImageDatastore((12, 12), source)[0][0]
    flipped = sum(torch.allclose(image, plain.flip(-1), atol=1e-6) for image in images)
    unchanged = sum(torch.allclose(image, plain, atol=1e-6) for image in images)
    assert images.shape == (64, 1, 12, 12) and 8 < flipped < 56 and flipped + unchanged == 64
    assert "augmented in batches" in resident.description


def test_any_tensor_dataset_works(tmp_path: Path) -> None:
    data = TensorDataset(torch.rand(30, 3, 4, 4), torch.arange(30) % 3)
    resident = DeviceResidentData(data, CPU)
    images, labels = next(resident.batches(30, shuffle=False))
    assert torch.equal(images, data.tensors[0]) and torch.equal(labels, data.tensors[1])


def test_unreadable_files_are_left_out_with_a_warning_when_skipping(tmp_path: Path) -> None:
    folder = write_digits_pngs(tmp_path / "digits", classes=[0, 1], limit_per_class=4)
    (folder / "0" / "zz_broken.png").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="Left out 1 unreadable"):
        resident = DeviceResidentData(ImageDatastore(folder, on_error="skip"), CPU)
    assert len(resident) == 8


def test_fits_on_device_compares_the_decoded_size_with_free_memory(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    assert fits_on_device(ds, CPU)
    assert not fits_on_device(ds, CPU, budget_fraction=1e-12)
