"""Reading one image file (local path or fsspec URL) into a uint8/uint16 C x H x W tensor with 1 or 3 channels.

TorchCodec's `decode_image` does the decoding (PNG, JPEG, GIF, WebP; no FFmpeg needed for images): torchvision
0.29 deprecated its own image decoders in its favour. Where torchcodec is missing or cannot load (a platform
without its wheels), torchvision's decoders are used, and their DeprecationWarning is left alone (Python shows
it only where the user asks for such warnings): nbscale never changes the process's warning filters. Pillow
covers the few formats neither has (BMP, TIFF). Alpha channels are dropped and palette (indexed) images expanded
to their colours: networks see grayscale (1 channel) or colour (3).

Before any decoding, the size the file's header claims is checked against `max_image_pixels()` (100 million
pixels, or `$NBSCALE_MAX_IMAGE_PIXELS`): a few-MB file can claim 65535 x 65535 pixels and decode to gigabytes,
more than a kernel or worker survives, where no `on_error="skip"` could catch it.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable
from typing import Literal, cast

import numpy as np
import torch

from nbscale.user_warnings import warn_user

_torchcodec_decode: Callable[..., torch.Tensor] | None
TORCHCODEC_FAILURE: str | None = None  # why an installed torchcodec did not load (`nbscale doctor` names it)
try:
    from torchcodec.decoders import decode_image as _torchcodec_decode
except ModuleNotFoundError as missing:  # not installed (or a module it needs is not)
    _torchcodec_decode = None
    if missing.name != "torchcodec":
        TORCHCODEC_FAILURE = f"{type(missing).__name__}: {missing}"
except (ImportError, OSError, RuntimeError) as failure:  # its library does not load here (built for another torch)
    _torchcodec_decode = None
    TORCHCODEC_FAILURE = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"

_PILLOW_ONLY = (".bmp", ".tif", ".tiff")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_PALETTE = 3  # IHDR colour type of an indexed (palette) PNG
MAX_IMAGE_PIXELS_VARIABLE = "NBSCALE_MAX_IMAGE_PIXELS"
DEFAULT_MAX_IMAGE_PIXELS = 100_000_000  # 10000 x 10000: 300 MB as uint8 RGB, 1.2 GB as float32


class ImageTooLarge(ValueError):
    """An image file whose header claims more pixels than `max_image_pixels()` (a decompression bomb)."""


def max_image_pixels() -> int:
    """The most pixels (width x height) an image file may claim: `$NBSCALE_MAX_IMAGE_PIXELS`, else 100 million."""
    from nbscale.errors import DatastoreError

    text = os.environ.get(MAX_IMAGE_PIXELS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_IMAGE_PIXELS
    try:
        limit = int(text.replace("_", ""))
    except ValueError:
        limit = 0
    if limit <= 0:
        raise DatastoreError(
            f"{MAX_IMAGE_PIXELS_VARIABLE}={text!r} is not a positive whole number of pixels: set "
            f"it to e.g. 200000000, or unset it for the default ({DEFAULT_MAX_IMAGE_PIXELS})."
        )
    return limit


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) as the file's header claims them, read by Pillow's format plugins without decoding any
    pixel; None where Pillow does not know the format (the decoder then judges the file).

    The plugins are called directly, not through `Image.open`: that refuses sizes above Pillow's own global
    limit, which would stand above a raised `$NBSCALE_MAX_IMAGE_PIXELS` (and changing the global is not ours)."""
    if data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR":  # most datasets' format: read directly (~1 us)
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    from PIL import Image

    Image.init()
    prefix = data[:16]
    for format_id in Image.ID:
        factory, accept = Image.OPEN[format_id]
        if accept is not None and not accept(prefix):
            continue
        try:
            with factory(io.BytesIO(data), "") as picture:
                return picture.size
        except Exception:
            continue
    return None


def check_size(data: bytes) -> None:
    """Raise ImageTooLarge when the header claims more than `max_image_pixels()` pixels."""
    size = header_size(data)
    limit = max_image_pixels()
    if size is not None and size[0] * size[1] > limit:
        raise ImageTooLarge(
            f"its header claims {size[0]} x {size[1]} = {size[0] * size[1]:,} pixels, more than "
            f"the limit of {limit:,}: set {MAX_IMAGE_PIXELS_VARIABLE} to a larger number of pixels "
            "to read it (it decodes to at least 3 bytes a pixel)"
        )


def is_url(location: str) -> bool:
    """True for an fsspec URL such as `s3://bucket/images` (anything with a protocol but `file://`)."""
    return "://" in location and not location.startswith("file://")


def read_bytes(file: str) -> bytes:
    """The bytes of a local file or an fsspec URL. A URL is fetched with one request, a range from byte 0: opening
    it as a file, or reading it whole with s3fs (which decides whether to fetch it in parallel parts), first asks
    the store for its size, one more request (a HEAD on S3) per file."""
    if is_url(file):
        import fsspec

        filesystem, path = fsspec.core.url_to_fs(file)
        return bytes(filesystem.cat_file(path, start=0))
    with open(file, "rb") as stream:
        return stream.read()


def decode(data: bytes, file: str) -> torch.Tensor:
    """Decode encoded image bytes to C x H x W (C is 1 or 3); raises on a corrupt or unknown file, and
    ImageTooLarge, before decoding, on one that claims more than `max_image_pixels()` pixels."""
    check_size(data)
    if file.lower().endswith(_PILLOW_ONLY):
        from PIL import Image

        with Image.open(io.BytesIO(data)) as picture:
            converted = picture.convert("L" if picture.mode in ("1", "L", "LA", "I;16") else "RGB")
            array = np.asarray(converted)
        image = torch.from_numpy(array.copy())
        image = image[None] if image.ndim == 2 else image.permute(2, 0, 1)
    else:
        # UNCHANGED would give a palette PNG's colour indices as one gray channel; expand them to colour instead
        palette = data[:8] == _PNG_SIGNATURE and len(data) > 25 and data[25] == _PNG_PALETTE
        image = _decode_encoded(torch.frombuffer(bytearray(data), dtype=torch.uint8), "RGB" if palette else "UNCHANGED")
        if image.ndim == 4:  # an animated GIF or WebP: its first frame
            image = image[0]
    channels = image.shape[0]
    if channels == 2:  # gray + alpha
        return image[:1]
    if channels == 4:  # RGB + alpha
        return image[:3]
    return image


def _decode_encoded(data: torch.Tensor, mode: Literal["RGB", "UNCHANGED"]) -> torch.Tensor:
    """Decode with torchcodec (16-bit PNGs stay uint16), else with torchvision's deprecated decoders."""
    if _torchcodec_decode is not None:
        return _torchcodec_decode(data, mode=mode, output_dtype="auto")
    if TORCHCODEC_FAILURE is not None:
        _warn_of_fallback()
    from torchvision.io import ImageReadMode, decode_image

    return cast(torch.Tensor, decode_image(data, mode=ImageReadMode[mode]))


@functools.cache
def _warn_of_fallback() -> None:
    """Once a process: an installed torchcodec failed, so torchvision's decoders read the images."""
    warn_user(f"{decoder_in_use()[1]} `nbscale doctor` shows the torch stack.")


def decoder_in_use() -> tuple[str, str | None]:
    """The image decoder nbscale uses here, and why it is not torchcodec when an installed torchcodec failed."""
    if _torchcodec_decode is not None:
        return f"torchcodec {_version('torchcodec')}", None
    if TORCHCODEC_FAILURE is None:
        return "torchvision's decoders (torchcodec is not installed)", None
    return "torchvision's decoders", (
        f"torchcodec {_version('torchcodec')} is installed but failed to load ({TORCHCODEC_FAILURE}), so images "
        f"decode with torchvision's deprecated decoders. Install the torchcodec release made for torch "
        f"{torch.__version__.split('+')[0]} (torchcodec's README lists which), or uninstall torchcodec."
    )


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


def read_image(file: str) -> torch.Tensor:
    """Read and decode one image file: an integer tensor C x H x W with C in (1, 3)."""
    return decode(read_bytes(file), file)


def to_float(image: torch.Tensor) -> torch.Tensor:
    """Integer pixels (uint8 or uint16) to float32 in [0, 1]; float tensors pass through."""
    if image.is_floating_point():
        return image.to(torch.float32)
    if image.dtype == torch.uint8:
        return image.to(torch.float32).div_(255.0)
    return image.to(torch.float32).div_(float(torch.iinfo(image.dtype).max))
