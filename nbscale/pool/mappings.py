"""A worker's mappings of the kernel's kept files (nbscale.pool.resident), reused between messages only while
they still hold exactly the file's values.

A kept file is mapped copy-on-write (MAP_PRIVATE): a write on the worker, through torch, a NumPy view, `.data` or a
library writing in place, copies the written page into the worker's own memory and leaves the file as it was. A
mapping is reused for the next message only when (1) no tensor or array of an earlier message still uses it (an
earlier call's value, a pushed variable: two calls would otherwise share one memory), and (2) none of its pages
was written (the kernel's page map says so: a written page is no longer the file's page). Otherwise the next
message gets a fresh mapping of the file, which costs page faults but no copy. Where the page map cannot be read
(not Linux), every message gets a fresh mapping.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from pathlib import Path
from typing import Any

from nbscale.processes import pid_running

_mapped: dict[str, tuple[Any, int]] = {}  # path -> (byte tensor mapping it, its storage's use count when mapped)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# linux/fs.h: PAGEMAP_SCAN = _IOWR('f', 16, struct pm_scan_arg), 12 u64 fields; page categories
_PAGEMAP_SCAN = (3 << 30) | (96 << 16) | (ord("f") << 8) | 16
_IS_FILE, _IS_PRESENT, _IS_SWAPPED = 1 << 2, 1 << 3, 1 << 4
_page_map_scan = {"works": True}  # False once the kernel refused PAGEMAP_SCAN (older than Linux 6.7)


def mapped(path: str, size: int, map_file: Any) -> Any:
    """The mapping of kept file `path` for this message: this process's earlier one when it is unchanged and
    unused, else a fresh one from `map_file(path, size)`."""
    entry = _mapped.get(path)
    if entry is not None and entry[0].numel() == size and _unused(entry) and not _written(entry[0]):
        return entry[0]
    buffer = map_file(path, size)
    _mapped[path] = (buffer, _use_count(buffer))
    return buffer


def release_removed() -> None:
    """Drop the mappings of files the kernel removed (their tensors were dropped or changed), so their memory goes
    as soon as no value of this process uses it. Called for every message a worker receives."""
    for path in [path for path in _mapped if not os.path.exists(path)]:
        del _mapped[path]


def remove_if_kernel_ended(deadline_s: float = 2.0) -> int:
    """The kernel's connection closed: remove the kept files this process mapped once the kernel that wrote them
    is gone (a kill -9 leaves them in shared memory otherwise); a kernel still running (the pool was stopped or
    this worker dropped) keeps its files. Returns how many were removed."""
    writers = {path: _writer(path) for path in _mapped}
    wait_for_end(set(writers.values()), deadline_s)
    return remove_files([path for path, pid in writers.items() if not pid_running(pid)])


def wait_for_end(pids: set[int], deadline_s: float) -> None:
    """Until none of `pids` runs, at most `deadline_s`."""
    ends = time.monotonic() + deadline_s
    while any(pid_running(pid) for pid in pids) and time.monotonic() < ends:
        time.sleep(0.02)  # the connection closes a moment before the process is gone


def remove_files(paths: list[str]) -> int:
    """Unlink each of `paths` that can be; how many went."""
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


def _writer(path: str) -> int:
    """The pid a kept file's name carries (nbscale-<pid>-<hex>)."""
    try:
        return int(Path(path).name.split("-")[1])
    except (IndexError, ValueError):
        return -1


def _use_count(buffer: Any) -> int:
    """How many tensors (and NumPy arrays) share `buffer`'s memory; -1 where torch cannot tell."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    return -1 if count is None else int(count(buffer.untyped_storage()._cdata))


def _unused(entry: tuple[Any, int]) -> bool:
    """No value handed out from this mapping is still alive (torch's use count is back to the mapping's own)."""
    return entry[1] >= 0 and _use_count(entry[0]) == entry[1]


def _written(buffer: Any) -> bool:
    """Whether any page of a private file mapping was written in this process (or whether that cannot be told)."""
    start = buffer.data_ptr() // _PAGE * _PAGE
    end = -(-(buffer.data_ptr() + buffer.numel()) // _PAGE) * _PAGE
    try:
        descriptor = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return True
    try:
        return _scan(descriptor, start, end) if _page_map_scan["works"] else _read_page_map(descriptor, start, end)
    except OSError:
        return True
    finally:
        os.close(descriptor)


def _scan(descriptor: int, start: int, end: int) -> bool:
    """PAGEMAP_SCAN (Linux 6.7+): is a page of [start, end) present or swapped and not the file's?"""
    import fcntl  # not on Windows, where pools do not run: imported here so that `import nbscale` works there

    found = (ctypes.c_uint64 * 3)()
    request = bytearray(
        struct.pack(
            "12Q",
            96,
            0,
            start,
            end,
            0,
            ctypes.addressof(found),
            1,
            1,
            _IS_FILE,
            _IS_FILE,
            _IS_PRESENT | _IS_SWAPPED,
            _IS_PRESENT | _IS_FILE | _IS_SWAPPED,
        )
    )
    try:
        return int(fcntl.ioctl(descriptor, _PAGEMAP_SCAN, request, True)) > 0
    except OSError:  # an older kernel: read the page map itself
        _page_map_scan["works"] = False
        return _read_page_map(descriptor, start, end)


def _read_page_map(descriptor: int, start: int, end: int) -> bool:
    """/proc/self/pagemap's entries of [start, end): bit 63 present, 62 swapped, 61 the file's page."""
    import numpy

    count = (end - start) // _PAGE
    raw = os.pread(descriptor, count * 8, start // _PAGE * 8)
    if len(raw) != count * 8:
        return True
    entries = numpy.frombuffer(raw, dtype=numpy.uint64) >> numpy.uint64(61)
    return bool(numpy.any((entries & numpy.uint64(0b110) != 0) & (entries & numpy.uint64(1) == 0)))
