"""ImageAugmenter (MATLAB's imageDataAugmenter): random reflections, rotation, scale, shear and translation.

Every transform works on a whole batch N x C x H x W at once, with different random values per image, on
whatever device the batch is on: the per-item path of a datastore calls it with N = 1, and the device-resident
path calls it on full mini-batches on the GPU. Reflections and translations alone are exact pixel moves
(one gather); rotation, scale or shear add a bilinear warp (`affine_grid` + `grid_sample`). Pixels that come
from outside the image are 0, as in MATLAB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

Range = tuple[float, float]


def crop_windows(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, height: int,
                 width: int) -> torch.Tensor:
    """Cut a height x width window from each image at its own (top, left); outside the image reads 0."""
    n, _, h, w = images.shape
    pad = max(0, int((-top).max()), int((-left).max()), int((top + height - h).max()), int((left + width - w).max()))
    padded = F.pad(images, (pad, pad, pad, pad)) if pad else images
    rows = (top.to(images.device) + pad)[:, None] + torch.arange(height, device=images.device)
    cols = (left.to(images.device) + pad)[:, None] + torch.arange(width, device=images.device)
    batch = torch.arange(n, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


@dataclass(frozen=True)
class ImageAugmenter:
    """Random image transforms with MATLAB's meanings; each range is (min, max), sampled uniformly per image.

    rand_x_reflection / rand_y_reflection: flip left-right / top-bottom with probability 0.5.
    rand_rotation: degrees, positive turns counterclockwise. rand_scale: one factor for both axes (when set,
    rand_x_scale and rand_y_scale are ignored, as in MATLAB). rand_x_shear / rand_y_shear: degrees, in (-90, 90).
    rand_x_translation / rand_y_translation: pixels, positive moves right / down; drawn as whole pixels so
    the image stays sharp (MATLAB draws a continuous distance and interpolates).
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

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("reflection"):
                if not isinstance(value, bool):
                    raise ValueError(f"ImageAugmenter: {field.name} must be True or False, not {value!r}.")
                continue
            if (not isinstance(value, tuple | list) or len(value) != 2
                    or not all(isinstance(v, int | float) for v in value) or value[0] > value[1]):
                raise ValueError(f"ImageAugmenter: {field.name} must be a (min, max) pair with min <= max, "
                                 f"e.g. {field.name}=(-4, 4); got {value!r}.")
            object.__setattr__(self, field.name, (float(value[0]), float(value[1])))
            if "scale" in field.name and value[0] <= 0:
                raise ValueError(f"ImageAugmenter: {field.name} factors must be positive; got {value!r}.")
            if "shear" in field.name and not (-90 < value[0] and value[1] < 90):
                raise ValueError(f"ImageAugmenter: {field.name} angles must lie in (-90, 90) degrees; got {value!r}.")

    @property
    def warps(self) -> bool:
        """True when rotation, scale or shear is asked for (a bilinear warp rather than exact pixel moves)."""
        return (self.rand_rotation != (0.0, 0.0) or self.rand_scale != (1.0, 1.0) or self.rand_x_scale != (1.0, 1.0)
                or self.rand_y_scale != (1.0, 1.0) or self.rand_x_shear != (0.0, 0.0)
                or self.rand_y_shear != (0.0, 0.0))

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Augment one float image C x H x W or a batch N x C x H x W (each image with its own random draw)."""
        if images.ndim == 3:
            return self.augment_batch(images[None], generator)[0]
        return self.augment_batch(images, generator)

    def augment_batch(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random transforms for a float batch N x C x H x W; random draws come from `generator` (CPU) if given."""
        n = images.shape[0]
        flip_x = self._coin(n, self.rand_x_reflection, generator)
        flip_y = self._coin(n, self.rand_y_reflection, generator)
        shift_x = self._whole_pixels(n, self.rand_x_translation, generator)
        shift_y = self._whole_pixels(n, self.rand_y_translation, generator)
        if self.warps:
            return self._warp(images, flip_x, flip_y, shift_x, shift_y, generator)
        if flip_x.any():
            images = torch.where(flip_x.to(images.device)[:, None, None, None], images.flip(-1), images)
        if flip_y.any():
            images = torch.where(flip_y.to(images.device)[:, None, None, None], images.flip(-2), images)
        if shift_x.any() or shift_y.any():
            images = crop_windows(images, -shift_y, -shift_x, images.shape[-2], images.shape[-1])
        return images

    @staticmethod
    def _coin(n: int, enabled: bool, generator: torch.Generator | None) -> torch.Tensor:
        if not enabled:
            return torch.zeros(n, dtype=torch.bool)
        return torch.rand(n, generator=generator) < 0.5

    @staticmethod
    def _uniform(n: int, bounds: Range, generator: torch.Generator | None) -> torch.Tensor:
        low, high = bounds
        if low == high:
            return torch.full((n,), low)
        return low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)

    @staticmethod
    def _whole_pixels(n: int, bounds: Range, generator: torch.Generator | None) -> torch.Tensor:
        low, high = math.ceil(bounds[0]), math.floor(bounds[1])
        if low >= high:
            return torch.full((n,), low if low == high else 0, dtype=torch.long)
        return torch.randint(low, high + 1, (n,), generator=generator)

    def _warp(self, images: torch.Tensor, flip_x: torch.Tensor, flip_y: torch.Tensor, shift_x: torch.Tensor,
              shift_y: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        n, _, height, width = images.shape
        angle = torch.deg2rad(self._uniform(n, self.rand_rotation, generator))
        if self.rand_scale != (1.0, 1.0):
            scale_x = scale_y = self._uniform(n, self.rand_scale, generator)
        else:
            scale_x = self._uniform(n, self.rand_x_scale, generator)
            scale_y = self._uniform(n, self.rand_y_scale, generator)
        shear_x = torch.tan(torch.deg2rad(self._uniform(n, self.rand_x_shear, generator)))
        shear_y = torch.tan(torch.deg2rad(self._uniform(n, self.rand_y_shear, generator)))
        one, zero = torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)

        def matrices(a: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(a, dim=-1).reshape(n, 2, 2).to(torch.float64)

        # forward map in pixel coordinates centred on the image (y points down): reflect, scale, shear, rotate
        reflect = matrices([torch.where(flip_x, -one, one), zero, zero, torch.where(flip_y, -one, one)])
        scale = matrices([scale_x, zero, zero, scale_y])
        shear = matrices([one, shear_x, shear_y, one])
        rotate = matrices([torch.cos(angle), torch.sin(angle), -torch.sin(angle), torch.cos(angle)])
        forward = rotate @ shear @ scale @ reflect
        shift = torch.stack([shift_x, shift_y], dim=-1).to(torch.float64)
        # affine_grid maps output to input coordinates, normalised to [-1, 1] (align_corners=False)
        to_unit = torch.diag(torch.tensor([2.0 / width, 2.0 / height], dtype=torch.float64))
        inverse = torch.linalg.inv(forward)
        theta = torch.cat([to_unit @ inverse @ torch.linalg.inv(to_unit),
                           -(to_unit @ inverse @ shift[:, :, None])], dim=2)
        grid = F.affine_grid(theta.to(images.device, torch.float32), list(images.shape), align_corners=False)
        return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
