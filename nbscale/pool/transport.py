"""Serialising messages: cloudpickle for code, with large tensors and arrays moved out of band.

Large buffers (tensors and numpy arrays of at least `OUT_OF_BAND_BYTES`) leave the pickle stream. Between
processes on one machine they travel through one file in shared memory (`/dev/shm`, mode 0600) that every
receiver copies from once; between machines, or when shared memory is full, they follow the pickle on the socket.
One `Frame` can be sent to many workers: it is serialised and written once, and every receiver maps it
copy-on-write (no copy at all until a receiver writes to it).
"""

from __future__ import annotations

import errno
import io
import marshal
import os
import pickle
import re
import secrets
import stat
import sys
import tempfile
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from nbscale.notices import notices
from nbscale.pool import mappings, resident
from nbscale.processes import pid_running
from nbscale.trust import swappable_by_others

if TYPE_CHECKING:
    import torch

OUT_OF_BAND_BYTES = 256 * 1024
# how a sent tensor is rebuilt: its dimensions' memory order, whether it was an nn.Parameter, its attributes
TensorKind = tuple[tuple[int, ...], bool, dict[str, Any] | None]


SHARED_MEMORY_DIR_VARIABLE = "NBSCALE_SHM_DIR"  # another folder for the files (tests point it at a small tmpfs)
_FILE_NAME = re.compile(r"nbscale-(\d+)-[0-9a-f]{16}")
_warned_full: set[str] = set()
_here = {"announce": True}  # whether this process prints shared-memory failures (workers leave it to the kernel)


def shared_memory_dir() -> Path | None:
    """Where out-of-band buffers go: `$NBSCALE_SHM_DIR`, else /dev/shm, else the temporary folder.

    None when `$NBSCALE_SHM_DIR` names a folder in which another user could swap the files between sender and
    receiver (nbscale.trust): large values then go on the pool's sockets, and the kernel says why once.
    """
    override = os.environ.get(SHARED_MEMORY_DIR_VARIABLE)
    if override:
        folder = Path(override)
        reason = swappable_by_others(folder / "nbscale-transfer")
        if reason is None:
            return folder
        _warn_untrusted(folder, reason)
        return None
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _warn_untrusted(folder: Path, reason: str) -> None:
    if not _here["announce"] or str(folder) in _warned_full:
        return
    _warned_full.add(str(folder))
    notices.warning(
        f"Warning: nbscale does not use {SHARED_MEMORY_DIR_VARIABLE}={folder} for the pool's large values: {reason}, "
        "so another user could swap them on their way to a worker. They go through the pool's sockets instead "
        f"(slower). Name a folder of yours that only you can write (mode 0700), or unset {SHARED_MEMORY_DIR_VARIABLE}."
    )


def stale_files(directory: Path | None = None) -> list[tuple[str, int]]:
    """This user's nbscale shared-memory files whose writer is gone (a kernel or worker killed mid-transfer, or a
    killed kernel's kept tensors), as (path, bytes). Files of running processes, of other users, and anything that
    is not a plain file are not listed."""
    directory = directory or shared_memory_dir()
    if directory is None:
        return []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = []
    for entry in entries:
        match = _FILE_NAME.fullmatch(entry.name)
        if match is None:
            continue
        try:
            details = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(details.st_mode) and details.st_uid == os.getuid() and not pid_running(int(match[1])):
            found.append((entry.path, details.st_size))
    return found


def remove_stale_files(directory: Path | None = None) -> int:
    """Delete `stale_files(directory)` (they would stay until reboot); returns how many."""
    return mappings.remove_files([path for path, _ in stale_files(directory)])


def remove_files_of_ended(pid: int, deadline_s: float = 2.0) -> int:
    """The local forkserver's part when the kernel `pid` that started it closed its end: once that process is gone,
    remove every shared-memory file it wrote (its kept tensors; the forkserver kills the workers at once, before
    they could). Returns how many were removed; none while the kernel runs (the pool was only stopped)."""
    mappings.wait_for_end({pid}, deadline_s)
    own = f"nbscale-{pid}-"  # stale_files lists only names of this form
    return mappings.remove_files([path for path, _ in stale_files() if Path(path).name.startswith(own)])


def _write_files(buffers: list[memoryview], directory: Path) -> list[str]:
    """One new 0600 file per buffer; on any failure every file begun here is removed before the error rises."""
    paths: list[str] = []
    try:
        for buffer in buffers:
            path = directory / f"nbscale-{os.getpid()}-{secrets.token_hex(8)}"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            paths.append(str(path))
            try:
                view = memoryview(buffer).cast("B")
                written = 0
                while written < len(view):
                    written += os.write(descriptor, view[written:])
            finally:
                os.close(descriptor)
    except BaseException:
        for begun in paths:
            Path(begun).unlink(missing_ok=True)
        raise
    return paths


def warn_shared_memory_failure(failure: tuple[str, int, str]) -> None:
    """Say once per process and folder why large values stopped going through shared memory.

    `failure` is (folder, bytes, cause) as `Frame.shm_failure` holds it. Workers do not print it: their frames carry
    it to the kernel, which says it once for the whole pool (see `announce_failures_here`).
    """
    directory, size, cause = failure
    if not _here["announce"] or directory in _warned_full:
        return
    _warned_full.add(directory)
    notices.warning(
        f"Warning: nbscale could not write a {size / 2**20:.1f} MiB transfer to shared memory in {directory} "
        f"({cause}), so large values go through the pool's sockets instead (slower). Free space there "
        f"(`df -h {directory}`) or make it larger (a container's --shm-size)."
    )


def announce_failures_here(announce: bool) -> None:
    """Whether this process prints shared-memory failures (the kernel does; workers leave it to the kernel)."""
    _here["announce"] = announce


@dataclass
class Frame:
    """A serialised message: the pickle, plus its large buffers, also written to shared-memory files once a
    receiver on this machine needs them (the buffers stay for receivers elsewhere)."""

    body: bytes
    buffers: list[memoryview]
    shm_paths: tuple[str, ...] = ()
    shm_sizes: tuple[int, ...] = ()
    # (message type, request_id, rank), readable even when the body cannot be unpickled at the other end
    label: tuple[str, int | None, int | None] = ("", None, None)
    # (folder, bytes, cause) when shared memory could not hold the buffers: they go on the socket
    shm_failure: tuple[str, int, str] | None = None
    # per buffer: (tensor, resident.fingerprint) for a tensor kept in shared memory across calls, else None
    residents: list[tuple[Any, tuple[Any, ...]] | None] = field(default_factory=list)
    shm_kept: tuple[bool, ...] = ()  # per file: a kept tensor's, which receivers must not remove
    _kept_files: list[resident.ResidentFile] = field(default_factory=list)

    def to_shared_memory(self) -> bool:
        """Write each buffer to its own shared-memory file (mode 0600: readable by this user only), once.

        Returns False when there are no buffers or shared memory cannot hold them (full, or not writable): then
        no file is left behind, the cause is printed once per process, and the buffers go on the socket.
        A full folder is first cleared of this user's stale files (remove_stale_files) and tried again.
        """
        if self.shm_paths or not self.buffers or self.shm_failure:
            return bool(self.shm_paths)
        directory = shared_memory_dir()
        if directory is None:  # a folder others could write: the socket (said once by shared_memory_dir)
            return False
        try:
            try:
                paths = self._write(directory)
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT) or not remove_stale_files(directory):
                    raise
                paths = self._write(directory)
        except OSError as error:
            self.shm_failure = (
                str(directory),
                sum(memoryview(b).nbytes for b in self.buffers),
                error.strerror or str(error),
            )
            warn_shared_memory_failure(self.shm_failure)
            return False
        self.shm_paths = tuple(paths)
        self.shm_sizes = tuple(memoryview(b).nbytes for b in self.buffers)
        self.shm_kept = tuple(kept is not None for kept in self._residents())
        return True

    def hold_values(self, local: bool) -> None:
        """Stop reading the sender's memory: its large buffers are views of the notebook's tensors and arrays until
        they are written out, so a frame that waits (a queued task) copies them now: to shared memory when every
        receiver is on this machine (`local`), else into memory of its own."""
        if local and self.to_shared_memory():
            self.buffers = []  # no receiver needs them on the socket
            return
        self.buffers = [memoryview(bytearray(buffer)) for buffer in self.buffers]

    def _residents(self) -> list[tuple[Any, tuple[Any, ...]] | None]:
        return self.residents or [None] * len(self.buffers)

    def _write(self, directory: Path) -> list[str]:
        """A file per buffer: a kept tensor's existing one (resident), a new one for the rest; all or none."""
        paths: list[str] = []
        try:
            for buffer, kept in zip(self.buffers, self._residents(), strict=True):
                if kept is None:
                    paths += _write_files([buffer], directory)
                else:
                    file = resident.acquire(kept[0], kept[1], buffer, lambda one: _write_files(one, directory))
                    self._kept_files.append(file)
                    paths.append(file.path)
        except BaseException:
            self._release_files(paths)
            raise
        return paths

    def _release_files(self, paths: list[str] | tuple[str, ...]) -> None:
        kept = {file.path for file in self._kept_files}
        for path in paths:
            if path not in kept:
                Path(path).unlink(missing_ok=True)
        for file in self._kept_files:
            resident.release(file)
        self._kept_files = []

    def release(self) -> None:
        """Delete the shared-memory files once every receiver has mapped them (a kept tensor's file stays)."""
        self._release_files(self.shm_paths)
        self.shm_paths = ()
        self.residents = []  # the tensors themselves: the frame no longer holds them alive


# ---- tensors and arrays out of band -------------------------------------------------------------------------


def _rebuild_tensor(buffer: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool, how: TensorKind) -> object:
    """The tensor whose bytes, in its own memory order, `buffer` (a byte tensor) holds; an nn.Parameter where
    one was sent, with its strides (channels_last stays so) and the attributes set on it."""
    import torch

    order, parameter, attributes = how
    stored = buffer.view(dtype).reshape([shape[dim] for dim in order])
    tensor = stored.permute([order.index(dim) for dim in range(len(order))])
    if parameter:
        tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
    elif requires_grad:
        tensor.requires_grad_(True)
    if attributes:
        tensor.__dict__.update(attributes)
    return tensor


def _rebuild_small_tensor(
    raw: bytes, dtype: Any, shape: tuple[int, ...], requires_grad: bool, how: TensorKind
) -> object:
    """A small CPU tensor sent in the pickle as its raw bytes (torch's own pickling saves a file per tensor)."""
    import numpy
    import torch

    buffer = torch.empty(len(raw), dtype=torch.uint8)
    if raw:
        buffer.numpy()[:] = numpy.frombuffer(raw, dtype=numpy.uint8)
    return _rebuild_tensor(buffer, dtype, shape, requires_grad, how)


def _memory_order(tensor: Any) -> tuple[Any, tuple[int, ...]]:
    """`tensor`'s values in its own memory order, as a contiguous tensor, and the order of its dimensions there
    (outermost first): a channels_last tensor is sent as it lies and rebuilt channels_last. A tensor that is not
    dense (a slice with gaps, an expanded one) is sent contiguous."""
    order = tuple(sorted(range(tensor.dim()), key=lambda dim: -tensor.stride(dim)))
    stored = tensor.permute(order)
    if stored.is_contiguous():
        return stored, order
    return tensor.contiguous(), tuple(range(tensor.dim()))


def _rebuild_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> object:
    import numpy

    return buffer.numpy().view(numpy.dtype(dtype)).reshape(shape)


_STANDARD_STREAMS = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle that hands large contiguous tensors/arrays to `buffers` instead of the stream."""

    def __init__(self, file: io.BytesIO, buffers: list[memoryview]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffers = buffers
        self.residents: list[tuple[Any, tuple[Any, ...]] | None] = []  # per buffer, see Frame.residents

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
        elif kind is types.CodeType:
            # whole, with its file name: cloudpickle 3.1.3 renames every function's file to "<dynamic-code>", and a
            # worker's traceback then cannot be mapped back to the notebook cell ("Cell In[3], line 3")
            return marshal.loads, (marshal.dumps(obj),)
        elif kind is io.TextIOWrapper and not any(obj is getattr(sys, name, None) for name in _STANDARD_STREAMS):
            # cloudpickle would send a copy of what is left to read: neither the file nor an error
            raise TypeError(f"{obj.name!r} is a file opened here: each process must open the file itself")
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor: Any) -> object:
        """A plain tensor or nn.Parameter as its bytes: out of band when large (moved to the CPU), else in the
        pickle; None (torch's own pickling) for any other kind of tensor."""
        import torch

        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
            return None
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return None  # a subclass keeps its own pickling
        data = tensor.detach().resolve_conj().resolve_neg()
        large = data.numel() * data.element_size() >= OUT_OF_BAND_BYTES
        if not large and data.device.type != "cpu":
            return None  # torch's own: a small tensor stays on its device
        stamp = resident.fingerprint(tensor)  # read before the data: a change meanwhile makes a new file next time
        data, order = _memory_order(data.cpu())
        raw = data.reshape(-1).view(torch.uint8).numpy()
        how = (order, type(tensor) is torch.nn.Parameter, dict(tensor.__dict__) or None)
        if not large:
            return _rebuild_small_tensor, (raw.tobytes(), data.dtype, tuple(tensor.shape), tensor.requires_grad, how)
        index = len(self._buffers)
        self._buffers.append(memoryview(raw))
        self.residents.append(None if stamp is None else (tensor, stamp))
        return _rebuild_out_of_band, (index, "tensor", data.dtype, tuple(tensor.shape), tensor.requires_grad, how)

    def _reduce_array(self, array: Any) -> object:
        if array.nbytes < OUT_OF_BAND_BYTES or array.dtype.hasobject or not array.flags.c_contiguous:
            return None
        index = len(self._buffers)
        self._buffers.append(memoryview(array.reshape(-1).view("uint8")))
        self.residents.append(None)
        return _rebuild_out_of_band, (index, "array", array.dtype.str, array.shape, False)


# Buffers of the frame being unpickled in this thread; `_rebuild_out_of_band` reads them by index.
_incoming = threading.local()


def _rebuild_out_of_band(
    index: int, kind: str, dtype: Any, shape: tuple[int, ...], requires_grad: bool, how: TensorKind | None = None
) -> object:
    buffer = _incoming.buffers[index]
    if kind == "tensor":
        assert how is not None  # a tensor's frame names how to rebuild it
        return _rebuild_tensor(buffer, dtype, shape, requires_grad, how)
    return _rebuild_array(buffer, dtype, shape)


def serialise(message: object, keep: bool = True) -> Frame:
    """Pickle `message` (functions and classes by value where needed), large buffers set aside; with `keep`, large
    tensors stay in shared memory for later messages (nbscale.pool.resident: the kernel's requests)."""
    stream = io.BytesIO()
    buffers: list[memoryview] = []
    pickler = _Pickler(stream, buffers)
    pickler.dump(message)
    label = (type(message).__name__, getattr(message, "request_id", None), getattr(message, "rank", None))
    residents = pickler.residents if keep and any(kept is not None for kept in pickler.residents) else []
    return Frame(stream.getvalue(), buffers, label=label, residents=residents)


def empty_bytes(size: int) -> Any:
    """An uninitialised byte tensor of `size` bytes, to receive a buffer into."""
    import torch

    return torch.empty(size, dtype=torch.uint8)


def _map_file(path: str, size: int) -> torch.Tensor:
    import torch

    return torch.from_file(path, shared=False, size=size, dtype=torch.uint8)


def map_shared_memory(paths: tuple[str, ...], sizes: tuple[int, ...], kept: tuple[bool, ...] = ()) -> list[Any]:
    """Map each shared-memory file copy-on-write: no copy is made, and writes stay private to this process. A kept
    tensor's file (`kept`) may reuse this process's mapping of it from an earlier message (nbscale.pool.mappings)."""
    kept = kept or (False,) * len(paths)
    return [
        mappings.mapped(path, size, _map_file) if keep else _map_file(path, size)
        for path, size, keep in zip(paths, sizes, kept, strict=True)
    ]


def deserialise(body: bytes, buffers: list[Any]) -> Any:
    """Unpickle a frame's body with its buffers (byte tensors) at hand."""
    previous = getattr(_incoming, "buffers", None)
    _incoming.buffers = buffers
    try:
        return pickle.loads(body)
    finally:
        _incoming.buffers = previous
