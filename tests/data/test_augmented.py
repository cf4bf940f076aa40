"""AugmentedImageDatastore on real files: output size modes, colour preprocessing, batched DataLoader reads."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore
from nbscale.errors import DatastoreError


def test_resize_brings_every_image_to_the_output_size(digits_folder: Path) -> None:
    ds = AugmentedImageDatastore((16, 12), ImageDatastore(digits_folder))
    image, label = ds[0]
    assert image.shape == (1, 16, 12) and label == 0 and len(ds) == 1797
    assert ds.classes == [str(i) for i in range(10)]


def test_centercrop_cuts_the_middle_exactly(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder)
    cropped, _ = AugmentedImageDatastore((4, 4), source, output_size_mode="centercrop")[7]
    assert torch.equal(cropped, source[7][0][:, 2:6, 2:6])


def test_randcrop_cuts_a_window_of_the_image(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder)
    original = source[3][0]
    windows = {(top, left): original[:, top : top + 5, left : left + 5] for top in range(4) for left in range(4)}
    ds = AugmentedImageDatastore((5, 5), source, output_size_mode="randcrop")
    found = set()
    for _ in range(40):
        crop, _ = ds[3]
        found |= {place for place, window in windows.items() if torch.equal(window, crop)}
    assert len(found) > 4


def test_gray2rgb_and_rgb2gray_set_the_channel_count(digits_folder: Path, photos_folder: Path) -> None:
    gray = AugmentedImageDatastore(8, ImageDatastore(digits_folder), color_preprocessing="gray2rgb")[0][0]
    assert gray.shape == (3, 8, 8) and torch.equal(gray[0], gray[2])
    colour = AugmentedImageDatastore((24, 32), ImageDatastore(photos_folder), color_preprocessing="rgb2gray")[0][0]
    assert colour.shape == (1, 24, 32)


def test_output_size_with_channels_gives_every_item_that_many_channels(
    digits_folder: Path, photos_folder: Path
) -> None:
    digits, photos = ImageDatastore(digits_folder), ImageDatastore(photos_folder)
    three = AugmentedImageDatastore((16, 16, 3), digits)  # MATLAB's [h w c], as for a 3-channel network
    assert three[0][0].shape == (3, 16, 16) and three.color_preprocessing == "gray2rgb"
    assert AugmentedImageDatastore((16, 16, 3), photos)[0][0].shape == (3, 16, 16)
    assert AugmentedImageDatastore((16, 16, 1), photos)[0][0].shape == (1, 16, 16)
    with pytest.raises(DatastoreError, match="gray2rgb"):
        AugmentedImageDatastore((16, 16, 1), digits, color_preprocessing="gray2rgb")
    with pytest.raises(DatastoreError, match="4 channels"):
        AugmentedImageDatastore((16, 16, 4), digits)


def test_a_torchvision_dataset_of_pil_images_is_augmented_and_trains_resident(digits_folder: Path) -> None:
    from torchvision.datasets import ImageFolder

    from nbscale.data.device_resident import DeviceResidentData

    folders = ImageFolder(str(digits_folder))  # no transform: items are (PIL image, class index)
    ds = AugmentedImageDatastore((12, 12), folders, ImageAugmenter(rand_rotation=(-10, 10)))
    image, label = ds[0]
    assert image.shape == (3, 12, 12) and image.dtype == torch.float32 and label == 0
    assert ds.classes == [str(i) for i in range(10)]
    images, labels = next(iter(DataLoader(ds, batch_size=8)))
    assert images.shape == (8, 3, 12, 12) and labels.tolist() == [0] * 8
    resident = DeviceResidentData(AugmentedImageDatastore((12, 12), Subset(folders, range(16))), torch.device("cpu"))
    batch, _ = next(resident.batches(16, shuffle=False))
    assert batch.shape == (16, 3, 12, 12) and batch.dtype == torch.float32


def test_augmenter_runs_before_sizing(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder)
    shifted, _ = AugmentedImageDatastore(8, source, ImageAugmenter(rand_x_translation=(2, 2)))[0]
    assert torch.equal(shifted[:, :, 2:], source[0][0][:, :, :-2])


def test_dataloader_batches_are_augmented_per_image(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder).subset([0] * 64)  # the same image 64 times
    ds = AugmentedImageDatastore(8, source, ImageAugmenter(rand_x_reflection=True))
    images, labels = next(iter(DataLoader(ds, batch_size=64)))
    original = source[0][0]
    flipped = sum(torch.equal(image, original.flip(-1)) for image in images)
    assert images.shape == (64, 1, 8, 8) and 8 < flipped < 56 and labels.tolist() == [0] * 64


def test_mixed_sizes_are_batched_after_sizing(digits_folder: Path, photos_folder: Path) -> None:
    ds = AugmentedImageDatastore(
        (20, 20),
        ImageDatastore([photos_folder, digits_folder / "5"]),
        ImageAugmenter(rand_y_reflection=True),
        color_preprocessing="gray2rgb",
    )
    images, _ = next(iter(DataLoader(ds, batch_size=4)))
    assert images.shape == (4, 3, 20, 20)


def test_split_and_shuffle_keep_the_augmentation_and_it_pickles_small(digits_folder: Path) -> None:
    ds = AugmentedImageDatastore(16, ImageDatastore(digits_folder), ImageAugmenter(rand_x_reflection=True))
    train, val = ds.split_each_label(0.8, randomize=True, seed=0)
    assert isinstance(train, AugmentedImageDatastore) and train.augmenter == ds.augmenter
    assert len(train) + len(val) == len(ds) and train.shuffle(seed=2).output_size == (16, 16)
    assert len(pickle.dumps(train)) < 120 * len(train)


@pytest.mark.parametrize("operation", ["count_each_label", "shuffle", "split_each_label"])
def test_datastore_operations_on_a_wrapped_plain_dataset_are_errors_naming_the_operation(operation: str) -> None:
    augmented = AugmentedImageDatastore(8, torch.utils.data.TensorDataset(torch.rand(4, 1, 8, 8), torch.arange(4)))
    with pytest.raises(DatastoreError, match=f"needs a datastore with {operation} underneath"):
        getattr(augmented, operation)(*([0.5] if operation == "split_each_label" else []))


def test_wrong_options_are_errors_naming_them(digits_folder: Path) -> None:
    source = ImageDatastore(digits_folder / "0")
    with pytest.raises(DatastoreError, match="color_preprocessing"):
        AugmentedImageDatastore(8, source, color_preprocessing="gray")
    with pytest.raises(DatastoreError, match="output_size_mode"):
        AugmentedImageDatastore(8, source, output_size_mode="crop")


def test_dispatch_in_background_on_the_datastore_trains_in_background_processes(digits_folder: Path) -> None:
    import nbscale

    source = ImageDatastore(digits_folder).subset(range(0, 1797, 9))
    ds = AugmentedImageDatastore((8, 8), source, ImageAugmenter(rand_x_reflection=True), dispatch_in_background=True)
    train, _ = ds.split_each_label(0.8, seed=0)
    assert train.dispatch_in_background and "dispatch_in_background=True" in repr(train)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    _, info = nbscale.train(net, train, nbscale.TrainingOptions("sgdm", max_epochs=1, plots="none", verbose=False))
    assert "background workers" in info.data_placement
    with pytest.raises(DatastoreError, match="dispatch_in_background must be True or False"):
        AugmentedImageDatastore(8, source, dispatch_in_background="yes")


def test_a_seeded_network_with_dropout_trains_alike_streamed_resident_and_in_background(digits_folder: Path) -> None:
    """Dropout draws from torch's global random stream; a DataLoader drew its processes' seed from it too (each
    epoch and each validation pass without background processes), so streaming trained another network."""
    import nbscale

    source = ImageDatastore(digits_folder).subset(range(0, 1797, 9))
    data = AugmentedImageDatastore((8, 8), source, ImageAugmenter(rand_x_reflection=True))
    trained = []
    for fields in ({"data_placement": "device"}, {"data_placement": "stream"}, {"dispatch_in_background": True}):
        options = nbscale.TrainingOptions(
            "sgdm",
            max_epochs=2,
            mini_batch_size=16,
            validation_data=data.subset(range(40)),
            validation_frequency=3,
            plots="none",
            verbose=False,
            **fields,
        )
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 10)
        )
        net, _ = nbscale.train(net, data, options)
        trained.append([parameter.detach() for parameter in net.parameters()])
    for other in trained[1:]:
        assert all(torch.equal(a, b) for a, b in zip(trained[0], other, strict=True))


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("DataAugmentation", "augmenter"),
        ("data_augmentation", "augmenter"),
        ("ColorPreprocessing", "color_preprocessing"),
        ("OutputSizeMode", "output_size_mode"),
    ],
)
def test_matlab_option_names_are_errors_naming_the_option_to_use(digits_folder: Path, typed: str, meant: str) -> None:
    from nbscale.errors import OptionsError

    with pytest.raises(OptionsError, match=f"AugmentedImageDatastore has no option '{typed}'. Did you mean '{meant}'"):
        AugmentedImageDatastore(8, ImageDatastore(digits_folder / "0"), **{typed: "none"})
