"""Serialising messages: cloudpickle for code, with large tensors and arrays moved out of band.

Large buffers (tensors and numpy arrays of at least `OUT_OF_BAND_BYTES`) leave the pickle stream. Between
processes on one machine they travel through one file in shared memory (`/dev/shm`, mode 0600) that every
receiver copies from once; between machines they follow the pickle on the socket. One `Frame` can be sent to
many workers: it is serialised and written once, and every receiver maps it copy-on-write (no copy at all
until a receiver writes to it).
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

OUT_OF_BAND_BYTES = 256 * 1024


def _shared_memory_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class Frame:
    """A serialised message: the pickle, plus its large buffers either inline or as shared-memory files."""

    body: bytes
    buffers: list[memoryview]
    shm_paths: tuple[str, ...] = ()
    shm_sizes: tuple[int, ...] = ()
    # (message type, request_id, rank), readable even when the body cannot be unpickled at the other end
    label: tuple[str, int | None, int | None] = ("", None, None)

    def to_shared_memory(self) -> None:
        """Write each buffer to its own shared-memory file (mode 0600: readable by this user only)."""
        if not self.buffers or self.shm_paths:
            return
        paths, sizes = [], []
        for buffer in self.buffers:
            path = _shared_memory_dir() / f"nbscale-{os.getpid()}-{secrets.token_hex(8)}"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(buffer).cast("B")
                written = 0
                while written < len(view):
                    written += os.write(descriptor, view[written:])
            finally:
                os.close(descriptor)
            paths.append(str(path))
            sizes.append(len(view))
        self.shm_paths, self.shm_sizes = tuple(paths), tuple(sizes)
        self.buffers = []

    def release(self) -> None:
        """Delete the shared-memory files once every receiver has mapped them."""
        for path in self.shm_paths:
            Path(path).unlink(missing_ok=True)
        self.shm_paths = ()


# ---- tensors and arrays out of band -------------------------------------------------------------------------


def _rebuild_tensor(buffer: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool) -> Any:

    tensor = buffer.view(dtype).reshape(shape) if shape else buffer.view(dtype).reshape(())
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _rebuild_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import numpy

    return buffer.numpy().view(numpy.dtype(dtype)).reshape(shape)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle that hands large contiguous tensors/arrays to `buffers` instead of the stream."""

    def __init__(self, file: io.BytesIO, buffers: list[memoryview]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffers = buffers

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        module = kind.__module__
        if module.startswith("torch") and kind.__name__ in ("Tensor", "Parameter"):
            reduced = self._reduce_tensor(obj)
            if reduced is not None:
                return reduced
        elif module == "numpy" and kind.__name__ == "ndarray":
            reduced = self._reduce_array(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor: Any) -> Any:
        import torch

        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
            return None
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return None
        if tensor.numel() * tensor.element_size() < OUT_OF_BAND_BYTES:
            return None
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.contiguous()
        index = len(self._buffers)
        self._buffers.append(memoryview(data.view(-1).view(torch.uint8).numpy()))
        return _rebuild_out_of_band, (index, "tensor", data.dtype, tuple(data.shape), tensor.requires_grad)

    def _reduce_array(self, array: Any) -> Any:
        if array.nbytes < OUT_OF_BAND_BYTES or array.dtype.hasobject or not array.flags.c_contiguous:
            return None
        index = len(self._buffers)
        self._buffers.append(memoryview(array.reshape(-1).view("uint8")))
        return _rebuild_out_of_band, (index, "array", array.dtype.str, array.shape, False)


# Buffers of the frame being unpickled in this thread; `_rebuild_out_of_band` reads them by index.
_incoming = threading.local()


def _rebuild_out_of_band(index: int, kind: str, dtype: Any, shape: tuple[int, ...], requires_grad: bool) -> Any:
    buffer = _incoming.buffers[index]
    if kind == "tensor":
        return _rebuild_tensor(buffer, dtype, shape, requires_grad)
    return _rebuild_array(buffer, dtype, shape)


def serialise(message: Any) -> Frame:
    """Pickle `message` (functions and classes by value where needed), large buffers set aside."""
    stream = io.BytesIO()
    buffers: list[memoryview] = []
    _Pickler(stream, buffers).dump(message)
    label = (type(message).__name__, getattr(message, "request_id", None), getattr(message, "rank", None))
    return Frame(stream.getvalue(), buffers, label=label)


def _empty_bytes(size: int) -> Any:
    import torch

    return torch.empty(size, dtype=torch.uint8)


def map_shared_memory(paths: tuple[str, ...], sizes: tuple[int, ...]) -> list[Any]:
    """Map each shared-memory file copy-on-write: no copy is made, and writes stay private to this process."""
    import torch

    return [torch.from_file(path, shared=False, size=size, dtype=torch.uint8) for path, size in zip(paths, sizes, strict=True)]


def deserialise(body: bytes, buffers: list[Any]) -> Any:
    """Unpickle a frame's body with its buffers (byte tensors) at hand."""
    previous = getattr(_incoming, "buffers", None)
    _incoming.buffers = buffers
    try:
        return pickle.loads(body)
    finally:
        _incoming.buffers = previous


def bytes_buffer(data: bytes) -> Any:
    """Wrap raw received bytes as an aligned byte tensor for `deserialise`."""
    buffer = _empty_bytes(len(data))
    memoryview(buffer.numpy())[:] = data
    return buffer
