"""ImageDatastore (MATLAB's imageDatastore): a lazy, labelled list of image files that is a torch Dataset.

Only file names and labels live in the object, so it pickles small and travels to pool workers cheaply;
pixels are read from disk (or through fsspec, for `s3://...` and other URLs) when an item is asked for.
nbscale.data.image_files finds the files a location holds.
"""

from __future__ import annotations

import numbers
import operator
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from nbscale.data.image_files import folder_name, image_files
from nbscale.data.option_names import check_option_names, keyword_names
from nbscale.data.reading import read_image, to_float
from nbscale.errors import DatastoreError
from nbscale.user_warnings import warn_user

DEFAULT_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")
LABEL_SOURCES = ("foldernames", "none")
ON_ERROR = ("raise", "skip")
# on_error="skip" gives up after this many unreadable files in a row: a folder of thousands of broken files would
# otherwise cost minutes on one item before its error
MAX_UNREADABLE_IN_A_ROW = 100

Location = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class ImageDatastore(Dataset[tuple[torch.Tensor, int]]):
    """Image files with labels, read lazily: item i is (image float32 C x H x W in [0, 1], label index).

    `location` is a folder, a file, an fsspec URL, or a list of them. With label_source="foldernames" each
    image is labelled by the name of the folder holding it; `classes` are the sorted label names and the
    yielded label is an index into them (-1 with label_source="none"). on_error="skip" replaces an unreadable
    file by the next readable one and warns with a count; "raise" raises a DatastoreError naming the file.
    """

    def __new__(cls, *args: object, **options: object) -> ImageDatastore:
        # before __init__, so a MATLAB name (IncludeSubfolders, LabelSource) or a typo names the option meant
        check_option_names("ImageDatastore", options, keyword_names(cls.__init__))
        return super().__new__(cls)

    def __init__(
        self,
        location: Location,
        include_subfolders: bool = True,
        label_source: str = "foldernames",
        file_extensions: str | Iterable[str] = DEFAULT_EXTENSIONS,
        on_error: str = "raise",
    ) -> None:
        if label_source not in LABEL_SOURCES:
            raise DatastoreError(f"ImageDatastore: label_source={label_source!r} is not one of {LABEL_SOURCES}.")
        if on_error not in ON_ERROR:
            raise DatastoreError(f"ImageDatastore: on_error={on_error!r} is not one of {ON_ERROR}.")
        extensions = (file_extensions,) if isinstance(file_extensions, str) else tuple(file_extensions)
        extensions = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)
        locations = _locations(location)
        files = image_files(locations, extensions, include_subfolders)
        labels = [folder_name(f) for f in files] if label_source == "foldernames" else None
        classes = sorted(set(labels)) if labels is not None else []
        self._setup(files, labels, classes, on_error)

    @classmethod
    def _from_parts(
        cls, files: list[str], labels: list[str] | None, classes: list[str], on_error: str
    ) -> ImageDatastore:
        datastore = cls.__new__(cls)
        datastore._setup(files, labels, classes, on_error)
        return datastore

    def _setup(self, files: list[str], labels: list[str] | None, classes: list[str], on_error: str) -> None:
        index = {name: i for i, name in enumerate(classes)}
        self._label_indices = [index[label] for label in labels] if labels is not None else None
        self.files = files
        # one string object per class, so a pickle stores each label name once
        self.labels = [classes[i] for i in self._label_indices] if self._label_indices is not None else None
        self.classes = classes
        self.on_error = on_error
        self.skipped_files: set[str] = set()

    # --- torch Dataset ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raw, index = self.read_raw(index)
        return to_float(raw), self.label_index(index)

    def label_index(self, index: int) -> int:
        """The class index of item `index` in `classes` (-1 with label_source="none")."""
        return self._label_indices[index] if self._label_indices is not None else -1

    def read_raw(self, index: int) -> tuple[torch.Tensor, int]:
        """The decoded integer image of item `index` (C x H x W) and the index actually read.

        With on_error="skip" an unreadable file is replaced by the next readable one (so the index may differ).
        IndexError outside the items, so `for image, label in ds` ends.
        """
        try:  # int, numpy and 0-d torch integers
            number = operator.index(index) if not isinstance(index, bool | np.bool_) else None
        except TypeError:
            number = None
        if number is None:
            raise DatastoreError(
                f"ImageDatastore: an item is asked for by its number (ds[0], ds[-1]), not by "
                f"{index!r}; for several items use ds.subset([...])."
            )
        index = number
        if not -len(self.files) <= index < len(self.files):
            raise IndexError(f"ImageDatastore index {index} is out of range for {len(self.files)} images.")
        index %= len(self.files)
        skipped: list[str] = []
        try:
            for attempt in range(len(self.files)):
                i = (index + attempt) % len(self.files)
                try:
                    return read_image(self.files[i]), i
                except Exception as error:  # decoders raise RuntimeError, OSError, ValueError...
                    if self.on_error == "raise":
                        raise DatastoreError(
                            f"ImageDatastore: cannot read image {self.files[i]!r} ({error}). "
                            "Remove or replace the file, or pass on_error='skip' to skip "
                            "unreadable images."
                        ) from error
                    skipped.append(self.files[i])
                    if len(skipped) == MAX_UNREADABLE_IN_A_ROW and len(skipped) < len(self.files):
                        raise DatastoreError(
                            f"ImageDatastore: {len(skipped)} files in a row cannot be read as images (from "
                            f"{skipped[0]!r} to {skipped[-1]!r}; the last: {error}). Check these files (empty or "
                            "unfinished downloads?) and remove them, e.g. with ds.subset(...)."
                        ) from error
        finally:
            self._note_skipped(skipped)
        raise DatastoreError(f"ImageDatastore: none of the {len(self.files)} files can be read as an image.")

    def _note_skipped(self, files: list[str]) -> None:
        """One warning per read, with a count, however many files it skipped."""
        new = [file for file in files if file not in self.skipped_files]
        if not new:
            return
        self.skipped_files.update(new)
        warn_user(
            f"ImageDatastore skipped {len(new)} unreadable image(s) ({len(self.skipped_files)} so far; "
            f"latest: {new[-1]!r})."
        )

    def __repr__(self) -> str:
        counts = (
            ", ".join(f"{name}: {n}" for name, n in list(self.count_each_label().items())[:8])
            if self.labels is not None
            else "unlabelled"
        )
        more = ", ..." if len(self.classes) > 8 else ""
        return f"ImageDatastore({len(self)} images, {len(self.classes)} classes: {counts}{more})"

    # --- MATLAB's datastore operations -----------------------------------------------------------------

    def count_each_label(self) -> dict[str, int]:
        """Number of images of each class, in class order (classes without images count 0)."""
        if self.labels is None:
            raise DatastoreError("count_each_label: this datastore has no labels (label_source='none').")
        counts = dict.fromkeys(self.classes, 0)
        for label in self.labels:
            counts[label] += 1
        return counts

    def subset(
        self, indices: Iterable[int] | Iterable[bool] | torch.Tensor, drop_unused_classes: bool = False
    ) -> ImageDatastore:
        """A datastore of the items at `indices`, with the same classes (label indices stay comparable).

        `indices` are item numbers, or, as in MATLAB, a logical mask with one True/False per item. Classes left
        without items stay (counted 0), as in MATLAB; drop_unused_classes=True removes them and renumbers the
        labels (see `remove_unused_classes`), so a network with one output per remaining class can train on it.
        """
        values = list(indices.tolist() if hasattr(indices, "tolist") else indices)  # tensors and numpy arrays
        if values and all(isinstance(v, bool | np.bool_) for v in values):
            if len(values) != len(self):
                raise DatastoreError(
                    f"subset: a logical mask needs one True/False per item ({len(self)}), not {len(values)}."
                )
            values = [i for i, keep in enumerate(values) if keep]
        wrong = [v for v in values if not isinstance(v, numbers.Integral) or isinstance(v, bool | np.bool_)]
        if wrong:
            raise DatastoreError(
                f"subset: indices must be whole item numbers (or a True/False mask with one value "
                f"per item), not {wrong[0]!r} ({type(wrong[0]).__name__}). For a random part use "
                "ds.shuffle(seed) or split_each_label(0.8, randomize=True)."
            )
        chosen = [int(i) for i in values]
        outside = [i for i in chosen if not -len(self) <= i < len(self)]
        if outside:
            raise DatastoreError(f"subset: indices {outside[:5]} are outside the {len(self)} items.")
        labels = [self.labels[i] for i in chosen] if self.labels is not None else None
        chosen_part = self._from_parts([self.files[i] for i in chosen], labels, list(self.classes), self.on_error)
        return chosen_part.remove_unused_classes() if drop_unused_classes else chosen_part

    def remove_unused_classes(self) -> ImageDatastore:
        """A datastore of the same items whose `classes` are only those with images (MATLAB's removecats).

        The remaining classes keep their order and their label indices are renumbered 0..k-1, so item labels,
        `classes` and `count_each_label()` agree. Returns a new datastore; this one is unchanged.
        """
        if self.labels is None:
            raise DatastoreError("remove_unused_classes: this datastore has no labels (label_source='none').")
        used = set(self.labels)
        classes = [name for name in self.classes if name in used]
        return self._from_parts(list(self.files), list(self.labels), classes, self.on_error)

    def shuffle(self, seed: int | None = None) -> ImageDatastore:
        """A datastore with the same items in a random order (reproducible with `seed`)."""
        order = list(range(len(self)))
        random.Random(seed).shuffle(order)
        return self.subset(order)

    def split_each_label(
        self, *fractions: float, randomize: bool = False, seed: int | None = None
    ) -> tuple[ImageDatastore, ...]:
        """Split every class by `fractions` (or counts, for whole numbers >= 1) into len(fractions)+1 datastores.

        Counts, as in MATLAB, must add up to at most the number of images of the smallest label (DatastoreError).

        `ds.split_each_label(0.7, 0.15)` gives three datastores with 70 %, 15 % and the rest of each label.
        Items keep their order unless randomize=True (reproducible with `seed`).
        """
        are_counts = _are_counts(fractions)
        groups: dict[str | None, list[int]] = {}
        for i in range(len(self)):
            groups.setdefault(self.labels[i] if self.labels is not None else None, []).append(i)
        if are_counts and groups:
            # as in MATLAB: counts must fit every label, or the parts would silently stop being balanced
            smallest = min(groups, key=lambda label: len(groups[label]))
            if sum(fractions) > len(groups[smallest]):
                named = f"label {smallest!r}" if smallest is not None else "the datastore"
                raise DatastoreError(
                    f"split_each_label: counts {tuple(int(f) for f in fractions)} take "
                    f"{sum(fractions)} images of each label, but {named} has only "
                    f"{len(groups[smallest])}. Give counts that add up to at most "
                    f"{len(groups[smallest])}, or fractions (split_each_label(0.8))."
                )
        generator = random.Random(seed)
        parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
        for members in groups.values():
            if randomize:
                generator.shuffle(members)
            bounds = _cut_points(len(members), fractions, are_counts)
            for part, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)):
                parts[part] += members[start:stop]
        return tuple(self.subset(sorted(p) if not randomize else p) for p in parts)

    def preview(self, n: int = 16, columns: int | None = None) -> Any:
        """A labelled montage of `n` images taken in turn from each class (a PIL image: it displays in a notebook)."""
        from nbscale.data.montage import montage, spread_over_classes

        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
            raise DatastoreError(f"preview: n={n!r} must be a whole number of images, at least 1 (default 16).")
        images, captions = [], []
        for i in spread_over_classes(self.labels, min(n, len(self))):
            raw, read = self.read_raw(i)
            images.append(to_float(raw))
            captions.append(self.labels[read] if self.labels is not None else Path(self.files[read]).name)
        return montage(images, captions, columns=columns)


def _locations(location: Any) -> list[Any]:
    """`location` as a list of places, or DatastoreError for what cannot name one (bytes, numbers...)."""
    places = (
        [location]
        if isinstance(location, str | bytes | os.PathLike) or not isinstance(location, Iterable)
        else list(location)
    )
    for place in places:
        if isinstance(place, bytes):
            raise DatastoreError(
                f"ImageDatastore: the location {place!r} is bytes: give it as a str "
                f"({place!r}.decode()) or a pathlib.Path."
            )
        if not isinstance(place, str | os.PathLike) or not os.fspath(place):
            raise DatastoreError(
                f"ImageDatastore: the location {place!r} is not a folder, file or URL: give a str or "
                "pathlib.Path (or a list of them), e.g. ImageDatastore('images/')."
            )
    return places


def _are_counts(fractions: tuple[float, ...]) -> bool:
    """True when `fractions` are whole-number counts of images per label, False for fractions of each label;
    DatastoreError for anything else (none given, no numbers, fractions outside [0, 1] or summing over 1)."""
    if not fractions:
        raise DatastoreError("split_each_label needs at least one fraction, e.g. split_each_label(0.8).")
    if not all(isinstance(f, numbers.Real) and not isinstance(f, bool) for f in fractions):
        raise DatastoreError(
            f"split_each_label: fractions {fractions} must be numbers: fractions of each label "
            "(split_each_label(0.8)) or whole-number counts of images per label "
            "(split_each_label(20))."
        )
    # numpy's integers count as counts too (len(ds) // 10, np.int64 from an array)
    are_counts = all(isinstance(f, numbers.Integral) and f >= 1 for f in fractions)
    if not are_counts and (any(not 0 <= f <= 1 for f in fractions) or sum(fractions) > 1 + 1e-9):
        raise DatastoreError(
            f"split_each_label: fractions {fractions} must each lie in [0, 1] and sum to at "
            "most 1 (or all be whole-number counts of images per label)."
        )
    return are_counts


def _cut_points(size: int, fractions: tuple[float, ...], are_counts: bool) -> list[int]:
    """Where a label's `size` items are cut into len(fractions)+1 parts: [0, ..., size]."""
    bounds, total = [0], 0.0
    for fraction in fractions:
        total += fraction
        bounds.append(min(size, int(total) if are_counts else round(total * size)))
    bounds.append(size)
    return bounds
