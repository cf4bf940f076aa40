"""ImageAugmenter on a known image: every option moves pixels where MATLAB's meaning says."""

from __future__ import annotations

import pytest
import torch

from nbscale.data import ImageAugmenter
from nbscale.errors import OptionsError

SIZE = 9  # odd, so the centre of rotation and scaling is a pixel (4, 4)


def known_image() -> torch.Tensor:
    """A 1 x 9 x 9 image whose every pixel has a different value."""
    return (torch.arange(SIZE * SIZE, dtype=torch.float32) / (SIZE * SIZE)).reshape(1, SIZE, SIZE)


def many(augmenter: ImageAugmenter, n: int = 64) -> torch.Tensor:
    return augmenter(known_image().expand(n, 1, SIZE, SIZE).contiguous(), torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("option", "flipped_dim"), [("rand_x_reflection", -1), ("rand_y_reflection", -2)])
def test_reflection_flips_about_half_the_images(option: str, flipped_dim: int) -> None:
    out = many(ImageAugmenter(**{option: True}))
    image = known_image()
    flipped = [torch.equal(o, image.flip(flipped_dim)) for o in out]
    unchanged = [torch.equal(o, image) for o in out]
    assert all(f or u for f, u in zip(flipped, unchanged, strict=True))
    assert 16 < sum(flipped) < 48


def test_x_translation_moves_right_by_the_stated_pixels_and_fills_zero() -> None:
    out = ImageAugmenter(rand_x_translation=(3, 3))(known_image())
    assert torch.equal(out[:, :, 3:], known_image()[:, :, :-3])
    assert torch.equal(out[:, :, :3], torch.zeros(1, SIZE, 3))


def test_y_translation_moves_up_for_negative_pixels() -> None:
    out = ImageAugmenter(rand_y_translation=(-2, -2))(known_image())
    assert torch.equal(out[:, :-2, :], known_image()[:, 2:, :])
    assert torch.equal(out[:, -2:, :], torch.zeros(1, 2, SIZE))


def test_translation_range_draws_whole_pixels_within_the_range() -> None:
    out = many(ImageAugmenter(rand_x_translation=(-2, 2)), n=200)
    image = known_image()
    shifts = set()
    for o in out:
        matches = [s for s in range(-2, 3) if torch.equal(o, ImageAugmenter(rand_x_translation=(s, s))(image))]
        assert len(matches) == 1
        shifts.add(matches[0])
    assert shifts == {-2, -1, 0, 1, 2}


def test_rotation_by_90_degrees_turns_counterclockwise() -> None:
    out = ImageAugmenter(rand_rotation=(90, 90))(known_image())
    assert torch.allclose(out, torch.rot90(known_image(), 1, dims=(-2, -1)), atol=1e-5)


def test_scale_zooms_about_the_centre() -> None:
    image = known_image()
    out = ImageAugmenter(rand_scale=(2, 2))(image)
    assert torch.allclose(out[0, 4, 6], image[0, 4, 5]) and torch.allclose(out[0, 2, 4], image[0, 3, 4])
    assert torch.allclose(out[0, 4, 4], image[0, 4, 4])


def test_x_and_y_scale_stretch_one_axis_each() -> None:
    image = known_image()
    wide = ImageAugmenter(rand_x_scale=(2, 2))(image)
    assert torch.allclose(wide[0, 1, 6], image[0, 1, 5]) and torch.allclose(wide[0, 1, 2], image[0, 1, 3])
    assert torch.allclose(wide[0, :, 4], image[0, :, 4])  # rows untouched along the centre column
    tall = ImageAugmenter(rand_y_scale=(2, 2))(image)
    assert torch.allclose(tall[0, 6, 1], image[0, 5, 1]) and torch.allclose(tall[0, 4, :], image[0, 4, :])


def test_rand_scale_takes_precedence_over_x_and_y_scale() -> None:
    both = ImageAugmenter(rand_scale=(2, 2), rand_x_scale=(0.5, 0.5))(known_image())
    assert torch.allclose(both, ImageAugmenter(rand_scale=(2, 2))(known_image()))


def test_x_shear_by_45_degrees_shifts_each_row_by_its_distance_from_the_centre() -> None:
    image = known_image()
    out = ImageAugmenter(rand_x_shear=(45, 45))(image)
    assert torch.allclose(out[0, 4], image[0, 4], atol=1e-5)
    assert torch.allclose(out[0, 5, 1:], image[0, 5, :-1], atol=1e-5)  # one row down: one pixel right
    assert torch.allclose(out[0, 2, :-2], image[0, 2, 2:], atol=1e-5)  # two rows up: two pixels left


def test_y_shear_by_45_degrees_shifts_each_column_by_its_distance_from_the_centre() -> None:
    image = known_image()
    out = ImageAugmenter(rand_y_shear=(45, 45))(image)
    assert torch.allclose(out[0, :, 4], image[0, :, 4], atol=1e-5)
    assert torch.allclose(out[0, 1:, 5], image[0, :-1, 5], atol=1e-5)


def test_each_image_of_a_batch_gets_its_own_draw_and_a_seed_repeats_it() -> None:
    augmenter = ImageAugmenter(rand_rotation=(-30, 30), rand_x_translation=(-2, 2))
    first, second = many(augmenter), many(augmenter)
    assert torch.equal(first, second)
    assert len({tuple(o.flatten().tolist()) for o in first}) > 32


def test_identity_augmenter_leaves_the_image_alone() -> None:
    assert torch.equal(ImageAugmenter()(known_image()), known_image())


@pytest.mark.parametrize(
    "options",
    [
        {"rand_rotation": 5},
        {"rand_x_translation": (4, -4)},
        {"rand_scale": (0, 2)},
        {"rand_x_shear": (-90, 10)},
        {"rand_x_reflection": "yes"},
    ],
)
def test_wrong_option_values_are_errors_naming_the_option(options: dict) -> None:
    with pytest.raises(OptionsError, match=next(iter(options))):
        ImageAugmenter(**options)


def test_fill_value_fills_what_comes_from_outside_the_image() -> None:
    out = ImageAugmenter(rand_x_translation=(3, 3), fill_value=0.5)(known_image())
    assert torch.allclose(out[:, :, 3:], known_image()[:, :, :-3])
    assert torch.equal(out[:, :, :3], torch.full((1, SIZE, 3), 0.5))
    rotated = ImageAugmenter(rand_rotation=(45, 45), fill_value=[1.0, 0.0, 0.25])(torch.zeros(3, SIZE, SIZE))
    assert rotated[:, 0, 0].tolist() == [1.0, 0.0, 0.25]  # a corner comes from outside: each channel's own fill


def test_fill_value_with_another_channel_count_is_an_error_naming_both() -> None:
    with pytest.raises(ValueError, match=r"fill_value=\(1.0, 0.0, 0.25\) has 3 values but the images have 1"):
        ImageAugmenter(rand_rotation=(45, 45), fill_value=(1.0, 0.0, 0.25))(known_image())
    with pytest.raises(ValueError, match="fill_value must be a number"):
        ImageAugmenter(fill_value="white")


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("RandXReflection", "rand_x_reflection"), ("FillValue", "fill_value"), ("rand_x_translate", "rand_x_translation")],
)
def test_matlab_names_and_typos_are_errors_naming_the_option_to_use(typed: str, meant: str) -> None:
    with pytest.raises(OptionsError, match=f"no option '{typed}'. Did you mean '{meant}'\\?"):
        ImageAugmenter(**{typed: True})
