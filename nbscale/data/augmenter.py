"""ImageAugmenter (MATLAB's imageDataAugmenter): random reflections, rotation, scale, shear and translation.

Every transform works on a whole batch N x C x H x W at once, with different random values per image, on
whatever device the batch is on: the per-item path of a datastore calls it with N = 1, and the device-resident
path calls it on full mini-batches on the GPU. The random values are drawn apart from the transform (`draw`
gives one row of uniform numbers per image, on any device; `apply` turns them into pixel moves), so the
device-resident path draws a whole epoch's values on the GPU at once and takes each batch's rows by index:
no random value crosses from the CPU, and nothing waits for the GPU. Reflections and translations alone are
exact pixel moves (one gather); rotation, scale or shear add a bilinear warp (`affine_grid` + `grid_sample`).
Pixels that come from outside the image are `fill_value` (0 by default, as in MATLAB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from nbscale.data.option_names import check_option_names
from nbscale.errors import OptionsError

Range = tuple[float, float]

# the columns of ImageAugmenter.draw's rows, each a uniform number in [0, 1)
_FLIP_X, _FLIP_Y, _SHIFT_X, _SHIFT_Y, _ANGLE, _SCALE_X, _SCALE_Y, _SHEAR_X, _SHEAR_Y = range(9)
DRAWS_PER_IMAGE = 9


def whole_pixels(uniform: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Whole numbers uniform in [low, high] (int64) from uniform numbers in [0, 1)."""
    return (uniform * (high - low + 1)).long().clamp_(max=high - low) + low


def gather_windows(
    images: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: int,
    width: int,
    pad: int,
    flip_x: torch.Tensor | None = None,
    flip_y: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cut a height x width window from each image at its own (top, left), the image mirrored first where
    flip_x / flip_y (N booleans) say; pixels outside the image read 0. One gather, no host synchronisation.

    `pad` must be at least how far any window reaches outside its image (known from the ranges the offsets were
    drawn from, so it is never read back from the device).
    """
    n, channels, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad)) if pad else images
    rows = _sources(top, height, h, flip_y) + pad
    cols = _sources(left, width, w, flip_x) + pad
    index = (rows[:, :, None] * (w + 2 * pad) + cols[:, None, :]).view(n, 1, height * width)
    out = padded.reshape(n, channels, -1).gather(2, index.expand(n, channels, height * width))
    return out.view(n, channels, height, width)


def _sources(start: torch.Tensor, length: int, size: int, flip: torch.Tensor | None) -> torch.Tensor:
    """Positions in the (mirrored where `flip`) image of `length` pixels from each `start`: N x length."""
    positions = start.to(torch.long)[:, None] + torch.arange(length, device=start.device)
    if flip is not None:
        positions = torch.where(flip[:, None], size - 1 - positions, positions)
    return positions


MAX_TRANSLATION = 10_000  # pixels, the side of the largest image reading allows (reading.DEFAULT_MAX_IMAGE_PIXELS)
MAX_SCALE = 1_000  # a larger factor shows one pixel of the image


@dataclass(frozen=True)
class ImageAugmenter:
    """Random image transforms with MATLAB's meanings; each range is (min, max), sampled uniformly per image.

    rand_x_reflection / rand_y_reflection: flip left-right / top-bottom with probability 0.5.
    rand_rotation: degrees, positive turns counterclockwise. rand_scale: one factor for both axes (when set,
    rand_x_scale and rand_y_scale are ignored, as in MATLAB). rand_x_shear / rand_y_shear: degrees, in (-90, 90).
    rand_x_translation / rand_y_translation: pixels, positive moves right / down; drawn as whole pixels so
    the image stays sharp (MATLAB draws a continuous distance and interpolates).
    fill_value: the value of pixels that come from outside the image, on the [0, 1] scale of the datastore's
    images (MATLAB's FillValue, in the image's own units there): one number, or one per channel.
    A wrong option name (MATLAB's RandXReflection, a typo) or value is an OptionsError (a ValueError) naming it.
    """

    rand_x_reflection: bool = False
    rand_y_reflection: bool = False
    rand_rotation: Range = (0.0, 0.0)
    rand_scale: Range = (1.0, 1.0)
    rand_x_scale: Range = (1.0, 1.0)
    rand_y_scale: Range = (1.0, 1.0)
    rand_x_shear: Range = (0.0, 0.0)
    rand_y_shear: Range = (0.0, 0.0)
    rand_x_translation: Range = (0.0, 0.0)
    rand_y_translation: Range = (0.0, 0.0)
    fill_value: float | tuple[float, ...] = 0.0

    def __new__(cls, *args: object, **options: object) -> ImageAugmenter:
        # runs before the dataclass's __init__, so an unknown option gets a message that names the right one
        check_option_names("ImageAugmenter", options, [field.name for field in fields(cls)])
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "fill_value":
                fill = _fill_values(value)
                object.__setattr__(self, field.name, fill if isinstance(value, tuple | list) else fill[0])
                continue
            if field.name.endswith("reflection"):
                if not isinstance(value, bool):
                    raise OptionsError(f"ImageAugmenter: {field.name} must be True or False, not {value!r}.")
                continue
            if (
                not isinstance(value, tuple | list)
                or len(value) != 2
                or not all(isinstance(v, int | float) and math.isfinite(v) for v in value)
                or value[0] > value[1]
            ):
                raise OptionsError(
                    f"ImageAugmenter: {field.name} must be a (min, max) pair with min <= max, "
                    f"e.g. {field.name}=(-4, 4) (finite numbers); got {value!r}."
                )
            object.__setattr__(self, field.name, (float(value[0]), float(value[1])))
            if "scale" in field.name and value[0] <= 0:
                raise OptionsError(f"ImageAugmenter: {field.name} factors must be positive; got {value!r}.")
            if "translation" in field.name and max(abs(value[0]), abs(value[1])) > MAX_TRANSLATION:
                raise OptionsError(
                    f"ImageAugmenter: {field.name}={value!r} moves images by more than "
                    f"{MAX_TRANSLATION} pixels (the largest images nbscale reads are 10000 wide); "
                    "give a range of pixels within the image, e.g. (-4, 4)."
                )
            if "scale" in field.name and value[1] > MAX_SCALE:
                raise OptionsError(f"ImageAugmenter: {field.name} factors must be at most {MAX_SCALE}; got {value!r}.")
            if "shear" in field.name and not (-90 < value[0] and value[1] < 90):
                raise OptionsError(f"ImageAugmenter: {field.name} angles must lie in (-90, 90) degrees; got {value!r}.")

    @property
    def warps(self) -> bool:
        """True when rotation, scale or shear is asked for (a bilinear warp rather than exact pixel moves)."""
        return (
            self.rand_rotation != (0.0, 0.0)
            or self.rand_scale != (1.0, 1.0)
            or self.rand_x_scale != (1.0, 1.0)
            or self.rand_y_scale != (1.0, 1.0)
            or self.rand_x_shear != (0.0, 0.0)
            or self.rand_y_shear != (0.0, 0.0)
        )

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Augment one float image C x H x W or a batch N x C x H x W (each image with its own random draw)."""
        if images.ndim == 3:
            return self.augment_batch(images[None], generator)[0]
        return self.augment_batch(images, generator)

    def augment_batch(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random transforms for a float batch N x C x H x W, drawn from `generator` (on its device) if given,
        else from the batch device's default generator."""
        device = generator.device if generator is not None else images.device
        return self.apply(images, self.draw(len(images), generator, device))

    @staticmethod
    def draw(
        n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """The random values of `n` images: an n x DRAWS_PER_IMAGE tensor of uniform numbers in [0, 1) on
        `device` (one draw, whatever the options; `apply` gives them their meaning)."""
        return torch.rand(n, DRAWS_PER_IMAGE, generator=generator, device=device)

    def apply(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Transform each image of a float batch N x C x H x W by its row of `draws` (from `draw`, any device)."""
        draws = draws.to(images.device)
        if self.fill_value not in (0.0, (0.0,)):
            # the transforms bring in zeros from outside the image: shift the pixels so those zeros are the fill
            fill = self._fill_for(images)
            return self._move(images - fill, draws) + fill
        return self._move(images, draws)

    def _fill_for(self, images: torch.Tensor) -> torch.Tensor:
        channels, fill = images.shape[1], _fill_values(self.fill_value)
        if len(fill) not in (1, channels):
            raise OptionsError(
                f"ImageAugmenter: fill_value={self.fill_value} has {len(fill)} values but the images "
                f"have {channels} channel(s): give one number, or one per channel."
            )
        return torch.tensor(fill, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)

    def _move(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        if self.warps:
            return self._warp(images, draws)
        n, _, height, width = images.shape
        (low_x, high_x), (low_y, high_y) = (
            self._pixel_range(self.rand_x_translation),
            self._pixel_range(self.rand_y_translation),
        )
        if not (self.rand_x_reflection or self.rand_y_reflection or low_x or high_x or low_y or high_y):
            return images
        # translation moves the image by (shift_x, shift_y): the window cut from it starts at minus the shift
        top = -whole_pixels(draws[:, _SHIFT_Y], low_y, high_y)
        left = -whole_pixels(draws[:, _SHIFT_X], low_x, high_x)
        pad = max(abs(low_x), abs(high_x), abs(low_y), abs(high_y))
        flip_x = draws[:, _FLIP_X] < 0.5 if self.rand_x_reflection else None
        flip_y = draws[:, _FLIP_Y] < 0.5 if self.rand_y_reflection else None
        return gather_windows(images, top, left, height, width, pad, flip_x, flip_y)

    @staticmethod
    def _pixel_range(bounds: Range) -> tuple[int, int]:
        """The whole-pixel shifts within `bounds` as (low, high); (0, 0) when no whole pixel lies strictly apart."""
        low, high = math.ceil(bounds[0]), math.floor(bounds[1])
        if low > high:
            return 0, 0
        return low, high

    @staticmethod
    def _uniform(draws: torch.Tensor, bounds: Range) -> torch.Tensor:
        low, high = bounds
        return low + (high - low) * draws.to(torch.float64)

    def _warp(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        n, _, height, width = images.shape
        angle = torch.deg2rad(self._uniform(draws[:, _ANGLE], self.rand_rotation))
        if self.rand_scale != (1.0, 1.0):
            scale_x = scale_y = self._uniform(draws[:, _SCALE_X], self.rand_scale)
        else:
            scale_x = self._uniform(draws[:, _SCALE_X], self.rand_x_scale)
            scale_y = self._uniform(draws[:, _SCALE_Y], self.rand_y_scale)
        shear_x = torch.tan(torch.deg2rad(self._uniform(draws[:, _SHEAR_X], self.rand_x_shear)))
        shear_y = torch.tan(torch.deg2rad(self._uniform(draws[:, _SHEAR_Y], self.rand_y_shear)))
        (low_x, high_x), (low_y, high_y) = (
            self._pixel_range(self.rand_x_translation),
            self._pixel_range(self.rand_y_translation),
        )
        shift = torch.stack(
            [whole_pixels(draws[:, _SHIFT_X], low_x, high_x), whole_pixels(draws[:, _SHIFT_Y], low_y, high_y)], dim=-1
        ).to(torch.float64)
        one = torch.ones(n, dtype=torch.float64, device=images.device)
        flip_x = torch.where(draws[:, _FLIP_X] < 0.5, -one, one) if self.rand_x_reflection else one
        flip_y = torch.where(draws[:, _FLIP_Y] < 0.5, -one, one) if self.rand_y_reflection else one
        zero = torch.zeros_like(one)

        def matrices(a: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(a, dim=-1).reshape(n, 2, 2)

        # forward map in pixel coordinates centred on the image (y points down): reflect, scale, shear, rotate
        reflect = matrices([flip_x, zero, zero, flip_y])
        scale = matrices([scale_x, zero, zero, scale_y])
        shear = matrices([one, shear_x, shear_y, one])
        rotate = matrices([torch.cos(angle), torch.sin(angle), -torch.sin(angle), torch.cos(angle)])
        inverse = _inverse_2x2(rotate @ shear @ scale @ reflect)
        # affine_grid maps output to input coordinates, normalised to [-1, 1] (align_corners=False)
        to_unit = torch.tensor([2.0 / width, 2.0 / height], dtype=torch.float64, device=images.device)
        linear = to_unit[:, None] * inverse / to_unit[None, :]
        offset = -(to_unit[:, None] * (inverse @ shift[:, :, None]))
        theta = torch.cat([linear, offset], dim=2).to(torch.float32)
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)
        return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _fill_values(value: object) -> tuple[float, ...]:
    values = tuple(value) if isinstance(value, tuple | list) else (value,)
    if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise OptionsError(
            f"ImageAugmenter: fill_value must be a number, or one number per channel, on the [0, 1] "
            f"scale of the images (e.g. fill_value=0.5); got {value!r}."
        )
    return tuple(float(v) for v in values)


def _inverse_2x2(matrices: torch.Tensor) -> torch.Tensor:
    """Inverses of N x 2 x 2 matrices, written out (torch.linalg.inv checks for singular matrices on the host,
    which waits for a GPU; these forward maps are never singular: scale factors are positive, shears < 90 degrees)."""
    a, b, c, d = matrices[:, 0, 0], matrices[:, 0, 1], matrices[:, 1, 0], matrices[:, 1, 1]
    return torch.stack([d, -b, -c, a], dim=-1).reshape(-1, 2, 2) / (a * d - b * c)[:, None, None]
