"""Large notebook tensors kept in shared memory across calls, so a dataset reaches a local pool's workers once.

The kernel writes a tensor of at least `RESIDENT_BYTES` to one shared-memory file the first time it is sent and
sends only the file's name while the tensor is unchanged: same object, same data pointer, shape, strides, offset
and dtype, and the same `tensor._version`, which every in-place change through torch bumps (views share it).
A changed tensor gets a new file (the old one goes once no message in flight names it), so a worker never reads
stale values. A file goes when its tensor is dropped (weakref finalizer), when the pool stops, and, after a kernel
kill, when the pool's forkserver sees the kernel gone (transport.remove_files_of_ended), else at the next pool start
(transport.remove_stale_files: its name carries the kernel's pid).

Workers map each file copy-on-write and reuse a mapping for the next call only while it is unused and unwritten
(nbscale.pool.mappings). Only the kernel keeps files; a worker's replies are one-off transfers.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

RESIDENT_BYTES = 8 * 2**20
_here = {"keep": True}  # whether this process keeps the tensors it sends in shared memory


def keep_tensors_here(keep: bool) -> None:
    """Whether tensors this process sends stay in shared memory (the kernel: yes; workers: no)."""
    _here["keep"] = keep


@dataclass(eq=False)
class ResidentFile:
    """One tensor's shared-memory file; `users` counts the frames that name it."""

    path: str
    size: int
    fingerprint: tuple[Any, ...]
    users: int = 0
    current: bool = True  # False once the tensor changed or was dropped: removed when no frame names it


_files: dict[int, ResidentFile] = {}  # by id() of the tensor, while it lives
_lock = threading.Lock()


def fingerprint(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What must stay equal for a file to still hold `tensor`'s values; None when it cannot be told (an inference
    tensor has no version counter, a tensor of a subclass may keep its data elsewhere), so it is sent each time."""
    if not _here["keep"] or tensor.numel() * tensor.element_size() < RESIDENT_BYTES:
        return None
    try:
        version = tensor._version
    except RuntimeError:  # inference-mode tensors track no version
        return None
    return (
        tensor.data_ptr(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.storage_offset(),
        tensor.dtype,
        str(tensor.device),
        version,
    )


def acquire(tensor: object, stamp: tuple[Any, ...], buffer: memoryview, write: Any) -> ResidentFile:
    """The file holding `tensor` as of `stamp`, written with `write([buffer])` unless a current one exists; the
    caller's frame counts as one of its users until `release`."""
    key = id(tensor)
    with _lock:
        known = _files.get(key)
        if known is not None and known.fingerprint == stamp:
            known.users += 1
            return known
    (path,) = write([buffer])
    fresh = ResidentFile(path, memoryview(buffer).nbytes, stamp, users=1)
    with _lock:
        known = _files.get(key)
        _files[key] = fresh
        if known is not None:
            known.current = False
            _remove_if_unused(known)
    if known is None:  # the first file of this tensor object: forget it when the object goes
        weakref.finalize(tensor, _forget, key)
    return fresh


def release(file: ResidentFile) -> None:
    """A frame naming `file` is done with it (every receiver mapped it)."""
    with _lock:
        file.users -= 1
        _remove_if_unused(file)


def _forget(key: int) -> None:
    with _lock:
        file = _files.pop(key, None)
        if file is not None:
            file.current = False
            _remove_if_unused(file)


def forget_all() -> None:
    """Remove every kept file (the pool stopped); files that frames still name go when those frames end."""
    with _lock:
        for file in _files.values():
            file.current = False
            _remove_if_unused(file)
        _files.clear()


def kept_bytes() -> int:
    """Bytes of shared memory held by kept tensors now."""
    with _lock:
        return sum(file.size for file in _files.values())


def _remove_if_unused(file: ResidentFile) -> None:
    if not file.current and file.users <= 0:
        Path(file.path).unlink(missing_ok=True)
