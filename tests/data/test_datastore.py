"""ImageDatastore on real PNG and JPEG files: labels, lazy reading, splits, errors, pickling, fsspec URLs."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from nbscale.data import AugmentedImageDatastore, ImageDatastore
from nbscale.errors import DatastoreError
from tests.datasets import write_digits_pngs


def test_digits_folders_give_labels_classes_and_counts(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    assert len(ds) == 1797
    assert ds.classes == [str(i) for i in range(10)]
    assert ds.count_each_label()["0"] == 178 and sum(ds.count_each_label().values()) == 1797
    assert Path(ds.files[0]).parent.name == ds.labels[0]


def test_grayscale_png_is_one_channel_float_in_unit_range(digits_folder: Path) -> None:
    image, label = ImageDatastore(digits_folder)[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0 and float(image.max()) > 0.5
    assert label == 0


def test_rgb_jpeg_is_three_channels(photos_folder: Path) -> None:
    ds = ImageDatastore(photos_folder)
    assert ds.classes == ["china", "flower"]
    image, label = ds[1]
    assert image.shape == (3, 48, 64) and label == 1


def test_palette_rgba_16_bit_and_uppercase_pngs_read_as_their_colours(tmp_path: Path) -> None:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = np.ascontiguousarray(load_sample_images().images[0][::20, ::20])  # china, 22 x 32 RGB
    folder = tmp_path / "mixed"
    folder.mkdir()
    Image.fromarray(photo).convert("P").save(folder / "palette.png")
    Image.fromarray(photo).convert("RGBA").save(folder / "rgba.png")
    Image.fromarray(photo).save(folder / "upper.PNG")
    Image.fromarray(photo[..., 0].astype("uint16") * 257).save(folder / "gray16.png")
    ds = ImageDatastore(folder)
    images = {Path(file).name: ds[i][0] for i, file in enumerate(ds.files)}
    assert set(images) == {"palette.png", "rgba.png", "upper.PNG", "gray16.png"}
    expected = torch.from_numpy(photo).permute(2, 0, 1).float() / 255
    palette_colours = torch.from_numpy(np.array(Image.open(folder / "palette.png").convert("RGB")))
    palette_colours = palette_colours.permute(2, 0, 1).float() / 255
    assert images["palette.png"].shape == (3, *photo.shape[:2])  # colours, not palette indices as gray
    assert torch.equal(images["palette.png"], palette_colours)
    assert torch.equal(images["rgba.png"], expected) and torch.equal(images["upper.PNG"], expected)
    assert images["gray16.png"].shape == (1, *photo.shape[:2])
    assert torch.allclose(images["gray16.png"][0], expected[0])


def test_file_extensions_and_subfolders_select_files(digits_folder: Path, tmp_path: Path) -> None:
    assert len(ImageDatastore(digits_folder, file_extensions=["png"])) == 1797
    with pytest.raises(DatastoreError, match=r"no image files with extensions \['.jpg'\]"):
        ImageDatastore(digits_folder, file_extensions="jpg")
    with pytest.raises(DatastoreError, match="include_subfolders=False: the images may be in its subfolders"):
        ImageDatastore(digits_folder, include_subfolders=False)  # the PNGs are all in subfolders
    one_class = ImageDatastore(digits_folder / "3", label_source="none")
    assert len(one_class) == 183 and one_class.labels is None and one_class[0][1] == -1


def test_hidden_files_and_folders_are_not_images_or_classes(tmp_path: Path) -> None:
    folder = write_digits_pngs(tmp_path / "digits", classes=[3, 4], limit_per_class=5)
    checkpoints = folder / "3" / ".ipynb_checkpoints"
    checkpoints.mkdir()
    shutil.copy(next((folder / "3").glob("*.png")), checkpoints / "copy-checkpoint.png")
    (folder / "3" / "._0001.png").write_bytes(b"macOS resource fork, not a PNG")
    (folder / "__MACOSX" / "4").mkdir(parents=True)
    (folder / "__MACOSX" / "4" / "._0002.png").write_bytes(b"macOS resource fork, not a PNG")
    ds = ImageDatastore(folder)
    assert ds.classes == ["3", "4"] and ds.count_each_label() == {"3": 5, "4": 5}
    assert all(image.shape == (1, 8, 8) for image, _ in (ds[i] for i in range(len(ds))))
    assert len(ImageDatastore(checkpoints)) == 1  # a hidden folder named on purpose is read


def test_symlinked_class_folders_are_followed_and_link_loops_end(tmp_path: Path) -> None:
    store = write_digits_pngs(tmp_path / "store", classes=[3, 4, 5], limit_per_class=4)
    data = tmp_path / "data"
    data.mkdir()
    for digit in ("3", "4"):
        (data / f"digit{digit}").symlink_to(store / digit, target_is_directory=True)  # class folders are links
    (data / "digit5").mkdir()
    (data / "digit5" / "back-up").symlink_to(data, target_is_directory=True)  # a loop back to the top
    (data / "digit5" / "one.png").symlink_to(next((store / "5").glob("*.png")))  # a linked file
    ds = ImageDatastore(data)
    assert ds.classes == ["digit3", "digit4", "digit5"]  # labelled by the links' names, as in MATLAB
    assert ds.count_each_label() == {"digit3": 4, "digit4": 4, "digit5": 1}
    assert ds[0][0].shape == (1, 8, 8)


def test_no_images_says_why_without_wrong_advice(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "cats").symlink_to(tmp_path / "moved-away", target_is_directory=True)
    with pytest.raises(DatastoreError) as caught:
        ImageDatastore(broken)
    assert "symbolic link(s) there point nowhere" in str(caught.value) and "moved-away" in str(caught.value)
    assert "file_extensions" not in str(caught.value)
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "notes.txt").write_text("not an image")
    with pytest.raises(DatastoreError, match=r"its files are \['.txt'\]: pass file_extensions="):
        ImageDatastore(texts)


def test_missing_and_empty_folders_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(DatastoreError, match="does not exist") as missing:
        ImageDatastore(tmp_path / "nowhere")
    assert "nowhere" in str(missing.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatastoreError, match="no image files") as empty:
        ImageDatastore(tmp_path / "empty")
    assert "empty" in str(empty.value) and "the folder has no files" in str(empty.value)


def test_split_each_label_keeps_the_proportion_of_every_label(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    train, val, test = ds.split_each_label(0.7, 0.2, randomize=True, seed=3)
    assert len(train) + len(val) + len(test) == len(ds)
    assert not set(train.files) & set(val.files) and not set(val.files) & set(test.files)
    for name, total in ds.count_each_label().items():
        assert train.count_each_label()[name] == round(0.7 * total)
        assert val.count_each_label()[name] == round(0.9 * total) - round(0.7 * total)
    again, _, _ = ds.split_each_label(0.7, 0.2, randomize=True, seed=3)
    assert again.files == train.files
    in_order, _ = ds.split_each_label(0.5)
    assert in_order.files == sorted(in_order.files)
    counts, _ = ds.split_each_label(10)
    assert set(counts.count_each_label().values()) == {10}
    with pytest.raises(DatastoreError, match="sum to at most 1"):
        ds.split_each_label(0.8, 0.5)


def test_split_each_label_takes_numpy_numbers_as_counts_and_fractions(digits_folder: Path) -> None:
    import numpy as np

    ds = ImageDatastore(digits_folder)
    counts, _ = ds.split_each_label(np.int64(10), randomize=True, seed=0)
    assert set(counts.count_each_label().values()) == {10}
    half, _ = ds.split_each_label(np.float32(0.5))
    assert half.count_each_label() == {name: round(0.5 * n) for name, n in ds.count_each_label().items()}
    with pytest.raises(DatastoreError, match="must be numbers"):
        ds.split_each_label("0.8")


def test_split_each_label_counts_beyond_the_smallest_label_are_an_error_naming_it(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    smallest, images = min(ds.count_each_label().items(), key=lambda item: item[1])
    parts = ds.split_each_label(images - 5, 5)
    assert parts[0].count_each_label()[smallest] == images - 5 and parts[2].count_each_label()[smallest] == 0
    with pytest.raises(
        DatastoreError, match=f"take {images + 1} images of each label, but label '{smallest}' has only {images}"
    ):
        ds.split_each_label(images - 5, 6)


def test_shuffle_and_subset_keep_files_labels_and_classes_together(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    shuffled = ds.shuffle(seed=1)
    assert sorted(shuffled.files) == ds.files and shuffled.files != ds.files
    assert all(Path(f).parent.name == label for f, label in zip(shuffled.files, shuffled.labels, strict=True))
    only_nines = ds.subset([i for i, label in enumerate(ds.labels) if label == "9"])
    assert only_nines.classes == ds.classes and {y for _, y in (only_nines[i] for i in range(5))} == {9}


def test_subset_takes_a_logical_mask_as_in_matlab(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    is_three = np.array(ds.labels) == "3"
    for mask in (is_three, torch.from_numpy(is_three), [bool(v) for v in is_three]):
        threes = ds.subset(mask)
        assert len(threes) == 183 and set(threes.labels) == {"3"}  # not items 0 and 1 picked by False/True
    with pytest.raises(DatastoreError, match="one True/False per item"):
        ds.subset([True, False])
    with pytest.raises(DatastoreError, match="outside the 1797 items"):
        ds.subset([0, 5000])


def test_iterating_a_datastore_ends_after_its_last_item(tmp_path: Path) -> None:
    folder = write_digits_pngs(tmp_path / "digits", classes=[1, 2], limit_per_class=3)
    ds = ImageDatastore(folder)
    assert [label for _, label in ds] == [0, 0, 0, 1, 1, 1]  # the old wrap-around made this loop forever
    assert len(list(AugmentedImageDatastore(4, ds))) == 6 and ds[-1][1] == 1
    with pytest.raises(IndexError, match="out of range for 6 images"):
        ds[6]


def test_corrupt_file_raises_naming_the_file_or_is_skipped_with_a_warning(tmp_path: Path) -> None:
    folder = write_digits_pngs(tmp_path / "digits", classes=[0, 1], limit_per_class=5)
    broken = folder / "1" / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    strict = ImageDatastore(folder)
    index = strict.files.index(str(broken))
    with pytest.raises(DatastoreError, match="broken.png"):
        strict[index]
    lenient = ImageDatastore(folder, on_error="skip")
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable image"):
        image, label = lenient[index]
    assert image.shape == (1, 8, 8) and lenient.skipped_files == {str(broken)}


def test_datastore_pickles_file_names_not_pixels(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder)
    pixels = sum(ds[i][0].numel() * 4 for i in range(len(ds)))
    pickled = pickle.dumps(ds)
    assert len(pickled) < 120 * len(ds) < pixels
    restored = pickle.loads(pickled)
    assert torch.equal(restored[5][0], ds[5][0]) and restored.classes == ds.classes


def test_reading_is_lazy_so_files_removed_later_fail_on_read(tmp_path: Path) -> None:
    folder = write_digits_pngs(tmp_path / "digits", classes=[2], limit_per_class=3)
    ds = ImageDatastore(folder)
    shutil.rmtree(folder)
    with pytest.raises(DatastoreError, match="cannot read image"):
        ds[0]


def test_works_with_a_dataloader_in_worker_processes(digits_folder: Path) -> None:
    ds = ImageDatastore(digits_folder).subset(range(0, 1797, 9))
    images, labels = next(iter(DataLoader(ds, batch_size=50, num_workers=2)))
    assert images.shape == (50, 1, 8, 8) and labels.dtype == torch.int64


def test_preview_is_a_labelled_montage_that_displays_in_a_notebook(digits_folder: Path) -> None:
    picture = ImageDatastore(digits_folder).shuffle(seed=0).preview(6)
    assert hasattr(picture, "_repr_png_") and picture.width > 0 and picture.height > 0
    assert len(set(picture.convert("L").tobytes())) > 2  # images and captions, not a blank sheet


def test_fsspec_url_lists_and_reads_through_fsspec(digits_folder: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for digit in ("4", "7"):
        for file in sorted((digits_folder / digit).iterdir())[:3]:
            memory.pipe(f"/nbscale-test/{digit}/{file.name}", file.read_bytes())
    try:
        ds = ImageDatastore("memory://nbscale-test")
        assert len(ds) == 6 and ds.classes == ["4", "7"] and ds.files[0].startswith("memory://")
        assert ds[0][0].shape == (1, 8, 8)
        with pytest.raises(DatastoreError, match="does not exist"):
            ImageDatastore("memory://nbscale-missing")
    finally:
        memory.rm("/nbscale-test", recursive=True)


def test_warnings_are_not_raised_for_clean_data(digits_folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ImageDatastore(digits_folder, on_error="skip")[0]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("IncludeSubfolders", "include_subfolders"),
        ("LabelSource", "label_source"),
        ("file_extension", "file_extensions"),
    ],
)
def test_matlab_option_names_and_typos_are_errors_naming_the_option_to_use(
    digits_folder: Path, typed: str, meant: str
) -> None:
    from nbscale.errors import OptionsError

    with pytest.raises(OptionsError, match=f"ImageDatastore has no option '{typed}'. Did you mean '{meant}'"):
        ImageDatastore(digits_folder, **{typed: True})


def test_wildcards_in_the_location_select_folders_and_files_as_in_matlab(digits_folder: Path) -> None:
    every = ImageDatastore(digits_folder)
    assert ImageDatastore(f"{digits_folder}/*/").files == every.files
    threes = ImageDatastore(f"{digits_folder}/3/*.png")
    assert threes.classes == ["3"] and len(threes) == every.count_each_label()["3"]
    assert ImageDatastore(f"{digits_folder}/[12]").classes == ["1", "2"]
    with pytest.raises(DatastoreError, match=r"nothing matches '.*/\*\.jpg'"):
        ImageDatastore(f"{digits_folder}/*.jpg")
