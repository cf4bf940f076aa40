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


class CountingTensors(TensorDataset):
    """A TensorDataset that counts the items read one by one."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        super().__init__(*tensors)
        self.items_read = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        self.items_read += 1
        return super().__getitem__(index)


def test_tensors_and_augmented_tensors_become_resident_without_reading_items_one_by_one() -> None:
    images, labels = torch.randint(0, 256, (500, 3, 8, 8), dtype=torch.uint8), torch.arange(500) % 10
    plain = CountingTensors(images.float(), labels)
    resident = DeviceResidentData(plain, CPU)
    assert plain.items_read == 0 and resident.images is plain.tensors[0]  # held as given, not copied
    source = CountingTensors(images, labels)
    augmented = AugmentedImageDatastore(
        (8, 8),
        torch.utils.data.Subset(source, range(100, 300)),
        ImageAugmenter(rand_x_reflection=True),
        color_preprocessing="rgb2gray",
    )
    resident = DeviceResidentData(augmented, CPU)
    assert source.items_read == 0 and resident.images.shape == (200, 1, 8, 8)
    batch, batch_labels = next(resident.batches(200, shuffle=False))
    assert batch_labels.tolist() == labels[100:300].tolist() and batch.dtype == torch.float32


def test_training_on_tensors_reads_no_item_one_by_one() -> None:
    import nbscale

    data = CountingTensors(torch.rand(1000, 64), torch.arange(1000) % 10)
    augmented = AugmentedImageDatastore(
        (8, 8),
        CountingTensors(torch.rand(1000, 1, 8, 8), torch.arange(1000) % 10),
        ImageAugmenter(rand_x_translation=(-1, 1)),
    )
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    for dataset in (data, augmented):
        options = nbscale.TrainingOptions(
            "sgdm", max_epochs=2, mini_batch_size=100, verbose=False, validation_data=dataset, validation_frequency=5
        )
        nbscale.train(model, dataset, options)
        counted = dataset if isinstance(dataset, CountingTensors) else dataset.ds
        assert counted.items_read <= 6  # the checks of the first items, not one read per item


def known_images(n: int) -> torch.Tensor:
    """n copies of a 1 x 6 x 7 image whose every pixel differs (uint8)."""
    return (torch.arange(42, dtype=torch.uint8) * 5 + 10).reshape(1, 1, 6, 7).repeat(n, 1, 1, 1)


def moves(image: torch.Tensor) -> dict[tuple[bool, int, int], torch.Tensor]:
    """Every reflection and whole-pixel shift (-2..2 each way) of `image`, as ImageAugmenter defines them."""
    return {
        (flip, dx, dy): ImageAugmenter(rand_x_translation=(dx, dx), rand_y_translation=(dy, dy))(
            image.flip(-1) if flip else image
        )
        for flip in (False, True)
        for dx in range(-2, 3)
        for dy in range(-2, 3)
    }


def test_resident_augmentation_moves_pixels_exactly_with_random_values_per_image() -> None:
    images = known_images(400)
    augmenter = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-2, 2), rand_y_translation=(-2, 2))
    resident = DeviceResidentData(
        AugmentedImageDatastore((6, 7), TensorDataset(images, torch.zeros(400).long()), augmenter), CPU
    )
    batch, _ = next(resident.batches(400, shuffle=False, generator=torch.Generator().manual_seed(0)))
    candidates = moves(images[0].float() / 255)
    found = [[key for key, moved in candidates.items() if torch.equal(moved, image)] for image in batch]
    assert all(len(keys) == 1 for keys in found)  # each image is exactly one reflection and shift of the original
    kinds = {keys[0] for keys in found}
    assert len(kinds) >= 45 and {flip for flip, _, _ in kinds} == {False, True}  # 50 kinds: drawn per image


def test_resident_augmentation_repeats_with_the_seed_and_follows_each_image_whatever_its_batch() -> None:
    images = torch.randint(0, 256, (64, 3, 10, 10), dtype=torch.uint8)
    augmented = AugmentedImageDatastore(
        (8, 8),
        TensorDataset(images, torch.arange(64)),
        ImageAugmenter(rand_x_reflection=True, rand_rotation=(-20, 20)),
        output_size_mode="randcrop",
    )
    resident = DeviceResidentData(augmented, CPU)
    order = torch.randperm(64)
    first = torch.cat([x for x, _ in resident.epoch(order.view(4, 16), seed=7)])
    again = torch.cat([x for x, _ in resident.epoch([order[:10], order[10:]], seed=7)])
    assert torch.equal(first, again)  # the same seed: the same draws, whatever the batches (or a pool's ranks)
    other = torch.cat([x for x, _ in resident.epoch(order.view(4, 16), seed=8)])
    assert not torch.equal(first, other) and first.shape == (64, 3, 8, 8)
