"""`nbscale doctor`: what this machine offers nbscale, each check one line with its fix.

Checks: the torch stack (torch and its CUDA, torchvision, the image decoder in use), GPUs (NVML), the
shared-memory folder pools pass large values through (and files killed processes left there), the job store, the
installed ipykernel's subshells (the Stop button while a cell runs), the JupyterLab extension, Ray. A check is "ok",
a "note" (something optional is missing: nbscale works without it) or a "problem" (something nbscale needs is not
usable here); `nbscale doctor` exits 1 when there is a problem.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "note", "problem"]
SMALL_SHM_BYTES = 1 << 30  # below this, a pool's large values and data loaders run short (Docker's default: 64 MB)
_MIB = 1 << 20


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, its status, and what it found (with the fix when not ok)."""

    name: str
    status: Status
    detail: str


def run_checks() -> list[Check]:
    """Every check, in order; a check that fails unexpectedly is reported as a problem, never raised."""
    found = []
    for name, check in _CHECKS:
        try:
            found.append(check())
        except Exception as error:  # a broken check is itself a finding
            found.append(Check(name, "problem", f"the check failed: {type(error).__name__}: {error}"))
    return found


def _gpus() -> Check:
    from nbscale.gpu import gpus

    listed = gpus()
    if not listed:
        return Check("GPUs", "note", f"{listed.message} Training runs on the CPU.")
    names = ", ".join(f"{gpu.index}: {gpu.name}" for gpu in listed)
    return Check("GPUs", "ok", f"{len(listed)} GPU{'s' if len(listed) > 1 else ''} through NVML ({names})")


def _shared_memory() -> Check:
    from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE, shared_memory_dir

    folder = shared_memory_dir()
    if folder is None:
        return Check(
            "shared memory",
            "problem",
            f"{SHARED_MEMORY_DIR_VARIABLE}={os.environ.get(SHARED_MEMORY_DIR_VARIABLE)} "
            "is a folder another user could write: pools pass large values on "
            "their sockets instead. Name a folder only you can write.",
        )
    if not os.access(folder, os.W_OK):
        return Check(
            "shared memory",
            "problem",
            f"{folder} cannot be written: pools pass large values through it. "
            f"Set {SHARED_MEMORY_DIR_VARIABLE} to a folder you can write to.",
        )
    free = shutil.disk_usage(folder).free
    where = f"{folder}: {free / _MIB:,.0f} MiB free"
    if free < SMALL_SHM_BYTES:
        return Check(
            "shared memory",
            "note",
            f"{where}, little for a pool's large values and data loaders. In a "
            "container, start it with a larger --shm-size (8g).",
        )
    return Check("shared memory", "ok", where)


def _stale_shared_memory() -> Check:
    from nbscale.pool.transport import stale_files

    stale = stale_files()
    if not stale:
        return Check("stale shm files", "ok", "no file left by a killed kernel or worker")
    size = sum(bytes_ for _, bytes_ in stale) / _MIB
    return Check(
        "stale shm files",
        "note",
        f"{len(stale)} file{'s' if len(stale) > 1 else ''} ({size:,.1f} MiB) left in {os.path.dirname(stale[0][0])} "
        "by a killed kernel or worker (the next pool start removes them too). "
        "`nbscale doctor --remove-stale` removes them now.",
    )


def remove_stale_shared_memory() -> str:
    """`nbscale doctor --remove-stale`: remove the files `_stale_shared_memory` reports; one line saying what went."""
    from nbscale.pool.transport import remove_stale_files, stale_files

    size = sum(bytes_ for _, bytes_ in stale_files()) / _MIB
    removed = remove_stale_files()
    return f"Removed {removed} stale shared-memory file{'' if removed == 1 else 's'} ({size:,.1f} MiB)."


def _job_store() -> Check:
    from nbscale.jobs import JobStore

    store = JobStore()  # JobError (damaged, not ours, not writable) says what and the fix
    free = shutil.disk_usage(store.root).free
    return Check(
        "job store", "ok", f"{store.root} ({len(store.job_ids_on_disk())} job folders, {free / _MIB:,.0f} MiB free)"
    )


def _subshells() -> Check:
    try:
        import ipykernel
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return Check("kernel subshells", "note", "ipykernel is not installed: no notebook kernel here.")
    version = ipykernel.__version__
    if not hasattr(Kernel, "create_subshell_request"):
        return Check(
            "kernel subshells",
            "note",
            f"ipykernel {version} has no subshells: the Stop button acts when "
            "the cell ends, not while it runs. ipykernel >= 7.4 has them.",
        )
    if _version_tuple(version) < (7, 4):
        return Check(
            "kernel subshells",
            "note",
            f"ipykernel {version} has subshells but does not route widget "
            "messages to them: the Stop button acts when the cell ends. "
            "ipykernel >= 7.4 routes them.",
        )
    return Check("kernel subshells", "ok", f"ipykernel {version}: the Stop button works while a cell runs")


def _lab_extension() -> Check:
    from nbscale.lab_extension import NOT_INSTALLED, installed_lab_extension

    found = installed_lab_extension()
    if found is None:
        return Check("lab extension", "note", f"{NOT_INSTALLED[0].upper()}{NOT_INSTALLED[1:]}")
    folder, version = found
    return Check("lab extension", "ok", f"version {version} in {folder}")


def _torch() -> Check:
    import torch

    cuda = torch.version.cuda
    if cuda is None:
        return Check("torch", "ok", f"torch {torch.__version__}, a CPU-only build (no CUDA)")
    usable = "CUDA usable" if torch.cuda.is_available() else "no CUDA device usable here"
    return Check("torch", "ok", f"torch {torch.__version__}, built with CUDA {cuda} ({usable})")


def _torchvision() -> Check:
    import torchvision

    return Check("torchvision", "ok", f"torchvision {torchvision.__version__}")


def _image_decoder() -> Check:
    from nbscale.data.reading import decoder_in_use

    decoder, failure = decoder_in_use()
    if failure is not None:
        return Check("image decoder", "problem", failure)
    return Check("image decoder", "ok", decoder)


def _ray() -> Check:
    try:
        import ray
    except ImportError:
        return Check(
            "Ray",
            "note",
            "not installed: pools and jobs run on this machine only. For clusters: pip install 'nbscale[cluster]'.",
        )
    return Check("Ray", "ok", f"ray {ray.__version__}")


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(char for char in part if char.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


_CHECKS: list[tuple[str, Callable[[], Check]]] = [
    ("torch", _torch),
    ("torchvision", _torchvision),
    ("image decoder", _image_decoder),
    ("GPUs", _gpus),
    ("shared memory", _shared_memory),
    ("stale shm files", _stale_shared_memory),
    ("job store", _job_store),
    ("kernel subshells", _subshells),
    ("lab extension", _lab_extension),
    ("Ray", _ray),
]
