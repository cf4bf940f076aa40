"""AugmentedImageDatastore (MATLAB's augmentedImageDatastore): colour conversion, augmentation, output size.

Each item goes through the same three steps as in MATLAB: colour preprocessing, the augmenter's random
transforms, then resizing or cropping to `output_size`. The steps are batch functions (`draw` gives each image's
random values, `apply` the transforms), so the device-resident path runs exactly the same code on whole
mini-batches on the GPU, with random values drawn there. A DataLoader fetching a mini-batch calls
`__getitems__`, which augments the batch in one go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from nbscale.data.augmenter import DRAWS_PER_IMAGE, ImageAugmenter, gather_windows, whole_pixels
from nbscale.data.datastore import ImageDatastore
from nbscale.data.option_names import check_option_names, keyword_names
from nbscale.data.reading import max_image_pixels, to_float
from nbscale.errors import DatastoreError

COLOR_PREPROCESSING = ("none", "gray2rgb", "rgb2gray")
OUTPUT_SIZE_MODES = ("resize", "centercrop", "randcrop")


# torchvision is imported where an image is converted, so training on tensors (which imports this module for its
# datastore checks) does not pay torchvision's import time


def convert_color(image: torch.Tensor, color_preprocessing: str) -> torch.Tensor:
    """gray2rgb repeats a 1-channel image to 3 channels; rgb2gray turns 3 channels into 1; others pass."""
    channels = image.shape[-3]
    if color_preprocessing == "gray2rgb" and channels == 1:
        return image.expand(*image.shape[:-3], 3, *image.shape[-2:]).contiguous()
    if color_preprocessing == "rgb2gray" and channels == 3:
        from torchvision.transforms.v2 import functional as TF

        return cast(torch.Tensor, TF.rgb_to_grayscale(image, num_output_channels=1))
    return image


def fit_to_size(
    images: torch.Tensor, output_size: tuple[int, int], mode: str, draws: torch.Tensor | None = None
) -> torch.Tensor:
    """Resize or crop a float batch N x C x H x W to output_size; crops larger than the image pad with 0.

    "randcrop" places each image's window by its two uniform numbers in `draws` (N x 2, any device; drawn here
    when not given).
    """
    height, width = output_size
    if tuple(images.shape[-2:]) == (height, width):
        return images
    if mode in ("resize", "centercrop"):
        from torchvision.transforms.v2 import functional as TF

        if mode == "resize":
            return cast(torch.Tensor, TF.resize(images, [height, width], antialias=True))
        return cast(torch.Tensor, TF.center_crop(images, [height, width]))
    n, _, h, w = images.shape
    if draws is None:
        draws = torch.rand(n, 2, device=images.device)
    draws = draws.to(images.device)
    top = whole_pixels(draws[:, 0], min(0, h - height), max(0, h - height))
    left = whole_pixels(draws[:, 1], min(0, w - width), max(0, w - width))
    return gather_windows(images, top, left, height, width, pad=max(0, height - h, width - w))


def _as_image_tensor(image: object) -> torch.Tensor:
    """An image from any Dataset as C x H x W: tensors pass, PIL images (torchvision datasets without a
    transform) and numpy arrays (H x W or H x W x C, as image libraries give them) are converted."""
    if isinstance(image, torch.Tensor):
        return image
    if isinstance(image, np.ndarray):
        tensor = torch.from_numpy(np.ascontiguousarray(image))
        return tensor[None] if tensor.ndim == 2 else tensor.permute(2, 0, 1)
    from PIL import Image

    if isinstance(image, Image.Image):
        from torchvision.transforms.v2 import functional as TF

        return cast(torch.Tensor, TF.pil_to_tensor(image.convert("RGB") if image.mode not in ("L", "RGB") else image))
    raise DatastoreError(
        f"AugmentedImageDatastore: the dataset yields {type(image).__name__} images; it needs "
        "tensors (C x H x W), PIL images or numpy arrays."
    )


def _preprocessing_for(channels: int, color_preprocessing: str, output_size: object) -> str:
    """The colour preprocessing that gives `channels` channels (3: gray2rgb, 1: rgb2gray), checked against the one
    given."""
    wanted = {3: "gray2rgb", 1: "rgb2gray"}.get(channels)
    if wanted is None:
        raise DatastoreError(
            f"AugmentedImageDatastore: output_size={output_size!r} asks for {channels} channels; "
            "images have 1 (grayscale) or 3 (colour)."
        )
    if color_preprocessing not in ("none", wanted):
        raise DatastoreError(
            f"AugmentedImageDatastore: output_size={output_size!r} asks for {channels} channel(s) "
            f"but color_preprocessing={color_preprocessing!r} gives {4 - channels}."
        )
    return wanted


class AugmentedImageDatastore(Dataset[tuple[torch.Tensor, int]]):
    """A datastore whose items are colour-converted, augmented, and brought to `output_size` (H, W).

    output_size may also be (H, W, C), as in MATLAB: C=3 turns grayscale images into colour (gray2rgb) and C=1
    colour into grayscale (rgb2gray), so every item has C channels.

    ds is an ImageDatastore (or any Dataset of (image, label) / image). output_size_mode: "resize" (scale to
    output_size), "centercrop" or "randcrop" (cut output_size from the centre / a random place).
    dispatch_in_background=True (MATLAB's DispatchInBackground): `nbscale.train` reads and augments this training
    data in background processes, as TrainingOptions(dispatch_in_background=True) does for any data.
    """

    def __new__(cls, *args: object, **options: object) -> AugmentedImageDatastore:
        # before __init__, so a MATLAB name (DataAugmentation, ColorPreprocessing) or a typo names the option meant
        check_option_names(
            "AugmentedImageDatastore",
            options,
            keyword_names(cls.__init__),
            meant={"data_augmentation": "augmenter", "image_size": "output_size"},
        )
        return super().__new__(cls)

    def __init__(
        self,
        output_size: int | Sequence[int],
        ds: Dataset[Any],
        augmenter: ImageAugmenter | None = None,
        color_preprocessing: str = "none",
        output_size_mode: str = "resize",
        dispatch_in_background: bool = False,
    ) -> None:
        size = [output_size, output_size] if isinstance(output_size, int) else [int(s) for s in output_size]
        if color_preprocessing not in COLOR_PREPROCESSING:
            raise DatastoreError(
                f"AugmentedImageDatastore: color_preprocessing={color_preprocessing!r} is not one "
                f"of {COLOR_PREPROCESSING}."
            )
        if len(size) == 3:  # MATLAB's [h w c]: c asks for that many channels (MATLAB ignores it; images would not fit)
            size, channels = size[:2], size[2]
            color_preprocessing = _preprocessing_for(channels, color_preprocessing, output_size)
        if len(size) != 2 or min(size) < 1:
            raise DatastoreError(
                f"AugmentedImageDatastore: output_size={output_size!r} must be (height, width) "
                "or (height, width, channels)."
            )
        if size[0] * size[1] > max_image_pixels():
            raise DatastoreError(
                f"AugmentedImageDatastore: output_size={output_size!r} is {size[0] * size[1]:,} "
                f"pixels an image, more than the limit of {max_image_pixels():,} "
                f"({size[0] * size[1] * 12 / 1e9:.1f} GB an RGB item as float32). Give a smaller "
                "size, or raise NBSCALE_MAX_IMAGE_PIXELS."
            )
        if output_size_mode not in OUTPUT_SIZE_MODES:
            raise DatastoreError(
                f"AugmentedImageDatastore: output_size_mode={output_size_mode!r} is not one of {OUTPUT_SIZE_MODES}."
            )
        if not isinstance(dispatch_in_background, bool):
            raise DatastoreError(
                "AugmentedImageDatastore: dispatch_in_background must be True or False, not "
                f"{dispatch_in_background!r}."
            )
        if augmenter is not None and not isinstance(augmenter, ImageAugmenter):
            raise DatastoreError(
                f"AugmentedImageDatastore: augmenter must be an ImageAugmenter, not {type(augmenter).__name__}."
            )
        self.output_size: tuple[int, int] = (size[0], size[1])
        self.ds = ds
        self.augmenter = augmenter
        self.color_preprocessing = color_preprocessing
        self.output_size_mode = output_size_mode
        self.dispatch_in_background = dispatch_in_background

    # what the underlying datastore knows, so trainers and classify see the same names
    @property
    def classes(self) -> list[str]:
        return list(getattr(self.ds, "classes", []))

    @property
    def files(self) -> list[str]:
        return list(getattr(self.ds, "files", []))

    @property
    def labels(self) -> list[str] | None:
        return getattr(self.ds, "labels", None)

    def count_each_label(self) -> dict[str, int]:
        """Images of each class, from the datastore underneath (see ImageDatastore.count_each_label)."""
        return cast("dict[str, int]", self._underlying("count_each_label").count_each_label())

    def _with(self, ds: Dataset[Any]) -> AugmentedImageDatastore:
        return AugmentedImageDatastore(
            self.output_size,
            ds,
            self.augmenter,
            self.color_preprocessing,
            self.output_size_mode,
            self.dispatch_in_background,
        )

    def subset(self, indices: object, drop_unused_classes: bool = False) -> AugmentedImageDatastore:
        """The items at `indices` (numbers or a logical mask); see ImageDatastore.subset."""
        chosen = self._underlying("subset").subset(indices)
        return self._with(chosen).remove_unused_classes() if drop_unused_classes else self._with(chosen)

    def remove_unused_classes(self) -> AugmentedImageDatastore:
        """The same items with only the classes that have images, labels renumbered (MATLAB's removecats)."""
        return self._with(self._underlying("remove_unused_classes").remove_unused_classes())

    def _underlying(self, operation: str) -> Any:
        if not hasattr(self.ds, operation):
            raise DatastoreError(
                f"AugmentedImageDatastore.{operation} needs a datastore with {operation} "
                f"underneath (an ImageDatastore); this one wraps a {type(self.ds).__name__}: "
                "select the items of that dataset first (e.g. torch.utils.data.Subset) and wrap "
                "the result."
            )
        return self.ds

    def shuffle(self, seed: int | None = None) -> AugmentedImageDatastore:
        """The same items in a random order, augmented alike (see ImageDatastore.shuffle)."""
        return self._with(self._underlying("shuffle").shuffle(seed))

    def split_each_label(
        self, *fractions: float, randomize: bool = False, seed: int | None = None
    ) -> tuple[AugmentedImageDatastore, ...]:
        """The datastore underneath split by label (see ImageDatastore.split_each_label), each part augmented
        alike: a validation part keeps the augmenter too (AugmentedImageDatastore(output_size, part.ds) is one
        without)."""
        parts = self._underlying("split_each_label").split_each_label(*fractions, randomize=randomize, seed=seed)
        return tuple(self._with(part) for part in parts)

    def __repr__(self) -> str:
        return (
            f"AugmentedImageDatastore(output_size={self.output_size}, {len(self)} images, "
            f"augmenter={'yes' if self.augmenter else 'none'}, color_preprocessing={self.color_preprocessing!r}, "
            f"output_size_mode={self.output_size_mode!r}"
            f"{', dispatch_in_background=True' if self.dispatch_in_background else ''})"
        )

    # --- torch Dataset -------------------------------------------------------------------------------

    def __len__(self) -> int:
        # torch's Dataset declares no __len__; datastores have one
        return len(self.ds)  # type: ignore[arg-type]

    def source_item(self, index: int) -> tuple[torch.Tensor, int]:
        """Item `index` before augmentation: (colour-converted image, label index); integer pixels if read raw."""
        if isinstance(self.ds, ImageDatastore):
            raw, read = self.ds.read_raw(index)
            image, label = raw, self.ds.label_index(read)
        else:
            item = self.ds[index]
            image, label = (item[0], int(item[1])) if isinstance(item, tuple | list) else (item, -1)
            image = _as_image_tensor(image)
        return convert_color(image, self.color_preprocessing), label

    def draw(
        self, n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """The random values of `n` images (augmentation, then a random crop's place), one row each, on `device`."""
        return torch.rand(n, DRAWS_PER_IMAGE + 2, generator=generator, device=device)

    def apply(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Augment and size a batch N x C x H x W of colour-converted images (float or integer pixels), each
        image by its row of `draws` (from `draw`)."""
        images = to_float(images)
        if self.augmenter is not None:
            images = self.augmenter.apply(images, draws[:, :DRAWS_PER_IMAGE])
        return fit_to_size(images, self.output_size, self.output_size_mode, draws[:, DRAWS_PER_IMAGE:])

    def prepare_batch(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Augment and size a batch N x C x H x W of colour-converted images, random values drawn from `generator`
        (on its device) if given, else from the batch device's default generator."""
        device = generator.device if generator is not None else images.device
        return self.apply(images, self.draw(len(images), generator, device))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.source_item(index)
        return self.prepare_batch(image[None])[0], label

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        items = [self.source_item(i) for i in indices]
        shapes = {tuple(image.shape) for image, _ in items}
        if len(shapes) > 1:  # images of different sizes: each is augmented and sized on its own
            return [(self.prepare_batch(image[None])[0], label) for image, label in items]
        batch = self.prepare_batch(torch.stack([image for image, _ in items]))
        return list(zip(batch.unbind(0), [label for _, label in items], strict=True))

    def preview(self, n: int = 16, columns: int | None = None) -> Any:
        """A labelled montage of `n` items as training sees them (augmented, sized), taken in turn from each class."""
        from nbscale.data.montage import montage, spread_over_classes

        items = [self[i] for i in spread_over_classes(self.labels, min(n, len(self)))]
        classes = self.classes
        captions = [classes[label] if 0 <= label < len(classes) else str(label) for _, label in items]
        return montage([image for image, _ in items], captions, columns=columns)
