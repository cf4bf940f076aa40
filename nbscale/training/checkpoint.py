"""Checkpoints: everything needed to continue a run exactly, written atomically, read without running code.

A checkpoint holds the network and optimizer state, the schedule position (epoch, iteration), the shuffle
seed, the RNG state, the best-validation bookkeeping and the history so far. It is written to a partial file
in the same folder, flushed to disk, then renamed over the final name, so a crash mid-write (or a worker
dying) never leaves a half-written checkpoint under a real name.

Reading trusts nothing in the file: `torch.load(weights_only=True)` with nbscale's history entry
(`IterationDone`) and `pathlib.PosixPath` (options of earlier versions) as the only extra globals, so a
crafted pickle cannot run code. A checkpoint file, and the folder it is looked up in, must also belong to the
user (or root) and be writable by no one else: anyone who can write there could plant the "newest" checkpoint.

Partial files (`.partial-nbscale_checkpoint_epoch*.pt`) left by a run killed mid-write are removed when the
next run prepares the folder, when no process holds their write lock (the writer locks its partial file with
flock until it renames it; the kernel drops the lock when the writer dies) and they are at least
`STALE_PARTIAL_S` old (so a file between its creation and its lock is never taken). Where there is no flock
(Windows: nbscale.file_locks), the age alone decides, and Windows refuses to delete a file still open.
"""

from __future__ import annotations

import os
import pathlib
import re
import stat
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from nbscale.errors import OptionsError
from nbscale.file_locks import hold_while_open, try_lock
from nbscale.safe_load import RefusedPickle, load_restricted
from nbscale.training.events import IterationDone
from nbscale.trust import posix_owners

if TYPE_CHECKING:
    from typing import BinaryIO

_PATTERN = "nbscale_checkpoint_epoch*.pt"
STALE_PARTIAL_S = 60.0
# what a checkpoint may refer to besides tensors and plain values: exactly these, nothing broader
CHECKPOINT_GLOBALS = {
    ("nbscale.training.events", "IterationDone"): IterationDone,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
}
# partial files: this version's, and the earlier mkstemp names (".partial-" + 8 random characters + ".pt")
_PARTIAL_PATTERN = ".partial-nbscale_checkpoint_epoch*.pt"
_EARLIER_PARTIAL = re.compile(r"\.partial-[a-z0-9_]{8}\.pt")


def checkpoint_file(folder: str | os.PathLike[str], epoch: int) -> Path:
    """The checkpoint of `epoch` in `folder` ("~" is the user's home, as in resume_from and prepare_folder)."""
    return Path(folder).expanduser() / f"nbscale_checkpoint_epoch{epoch:04d}.pt"


def save_checkpoint(folder: str | os.PathLike[str], epoch: int, state: dict[str, Any]) -> Path:
    """Write `state` as the checkpoint of `epoch` in `folder` (created 0700 if needed); returns its path.

    The file is 0600. Options are stored as plain values (a Path as its string), so that the checkpoint
    loads with nothing but the globals in CHECKPOINT_GLOBALS.
    """
    target = checkpoint_file(folder, epoch)
    if "options" in state:
        state = {**state, "options": {name: _plain(value) for name, value in state["options"].items()}}
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".partial-{target.stem}-", suffix=".pt", dir=target.parent)
    except OSError as error:
        raise _unwritable(folder, epoch, error) from None
    try:
        hold_while_open(handle)  # held until closed: a clean-up never takes a file being written
        with os.fdopen(handle, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
            os.replace(temporary, target)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        cause = _os_error_in(error) if isinstance(error, Exception) else None  # an interrupt stays an interrupt
        if cause is not None:
            raise _unwritable(folder, epoch, cause) from None
        raise
    return target


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind a failed write: itself, or the one torch's zip writer failed on (a RuntimeError)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _unwritable(folder: str | os.PathLike[str], epoch: int, error: OSError) -> OptionsError:
    """The one-paragraph error for a checkpoint that could not be written (full disk, folder removed or made
    read-only during the run): torch's zip-writer traceback says nothing a user can act on."""
    cause = error.strerror or str(error)
    return OptionsError(
        f"checkpoint_path={str(folder)!r}: the checkpoint of epoch {epoch} could not be written ({cause}); no partial "
        "file was left. Free space there (or make the folder writable again), or give another checkpoint_path. "
        "Checkpoints written before this one are intact."
    )


def _plain(value: object) -> object:
    """An option value as str, number, bool, None, or a list of those (what weights_only loading reads)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    for kind in (bool, int, float, str):  # subclasses (numpy.float64 is a float) would pickle as their own type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy or torch scalar
        return value.item()
    if hasattr(value, "tolist"):  # a numpy array or tensor
        return _plain(value.tolist())
    return repr(value)


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The checkpoint in `folder` written last (of two written together, the later epoch), or None.

    By time, not by epoch: a run started again in the folder with fewer epochs overwrites the first epochs' files
    and leaves the earlier run's later ones, which the highest epoch number would pick.
    """
    found = []
    for path in Path(folder).expanduser().glob(_PATTERN):
        try:
            found.append((path.stat().st_mtime_ns, path.name, path))
        except FileNotFoundError:  # removed meanwhile
            continue
    return max(found)[2] if found else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint file, or the newest one in a folder; OptionsError when there is none, when the file
    or folder may have been written by someone else, or when the file refers to anything but tensors, plain
    values and nbscale's history entries (it is never unpickled then)."""
    if not isinstance(path, str | os.PathLike):
        raise OptionsError(
            f"resume_from={path!r:.40} is not a path: pass a checkpoint file or the checkpoint_path "
            "folder of an earlier run (a str or a pathlib.Path)."
        )
    name = f"resume_from={os.fspath(path)!r}"
    path = Path(path).expanduser()
    if path.is_dir():
        refuse_untrusted(path, name, folder=True)
        newest = latest_checkpoint(path)
        if newest is None:
            raise OptionsError(
                f"{name} holds no checkpoint ({_PATTERN}): pass a checkpoint file or the "
                "checkpoint_path of an earlier run."
            )
        path = newest
    if not path.exists():
        raise OptionsError(f"{name} does not exist: pass a checkpoint file or folder.")
    if not path.is_file():  # checked before opening: opening a pipe waits for a writer forever
        raise OptionsError(
            f"{name} is not a regular file (a pipe, device or socket): pass a checkpoint file or folder."
        )
    path = path.resolve()
    refuse_untrusted(path.parent, name, folder=True, sticky_ok=True)
    try:
        stream = open(path, "rb")  # closed below; checked as opened, so it cannot be swapped
    except OSError as error:
        raise OptionsError(
            f"{name} cannot be opened ({error.strerror or error}): pass a checkpoint file you can read."
        ) from None
    with stream:
        refuse_untrusted(path, name, folder=False, status=os.fstat(stream.fileno()))
        try:
            state = load_restricted(stream, CHECKPOINT_GLOBALS)
        except RefusedPickle as refused:
            raise OptionsError(
                f"{name} {refused.describe()}, which nbscale does not unpickle: a checkpoint holds "
                "tensors, plain values and nbscale's history entries, and anything else could run "
                "code. Resume from a checkpoint nbscale wrote, or train from the start without "
                "resume_from."
            ) from None
        except Exception as error:
            raise _unreadable(name, path, stream, error) from None
    problem = _state_problem(state)
    if problem:
        raise OptionsError(
            f"{name} is not an nbscale training checkpoint ({problem}): pass a file that "
            f"checkpoint_path received ({_PATTERN}), or its folder. (A file of weights alone loads "
            "with model.load_state_dict(torch.load(path)).)"
        )
    return cast("dict[str, Any]", state)


def _unreadable(name: str, path: Path, stream: BinaryIO, error: Exception) -> OptionsError:
    """The error for a checkpoint torch cannot read. One cut short (a copy that did not finish; nbscale's own writes
    are atomic) is empty or starts as the zip archive torch writes but lacks its end, and torch's words for it
    (`Invalid argument`, an empty EOFError) do not say so: name that, and the checkpoints beside it to resume from
    instead."""
    stream.seek(0)
    start = stream.read(4)
    cut_short = start in (b"", b"PK\x03\x04") and not zipfile.is_zipfile(stream)  # a zip's start, but not its end
    if not cut_short:
        return OptionsError(
            f"{name} cannot be read as a checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}): pass a file nbscale wrote "
            f"({_PATTERN}) or its folder."
        )
    others = sorted(other.name for other in path.parent.glob(_PATTERN) if other != path)
    beside = f" Checkpoints beside it in {str(path.parent)!r}: {', '.join(others)}." if others else ""
    if not name.endswith(f"{path.name}'"):  # a folder was given: name the file in it that was read
        name += f": its newest checkpoint, {path.name},"
    return OptionsError(
        f"{name} is cut short or damaged ({os.fstat(stream.fileno()).st_size} bytes, not a whole "
        "checkpoint: a copy or download that did not finish, or a disk that filled as it was copied). "
        f"Resume from another checkpoint, or train from the start without resume_from.{beside}"
    )


# what each entry of a checkpoint must be (a file of the right globals can still hold anything in them)
_STATE_KINDS: dict[str, tuple[type, ...]] = {
    "model": (dict,),
    "optimizer": (dict,),
    "epoch": (int,),
    "iteration": (int,),
    "seed": (int,),
    "history": (list,),
    "best": (dict,),
    "rng": (torch.Tensor,),
}
_OPTIONAL_KINDS: dict[str, tuple[type, ...]] = {"options": (dict,), "samples": (int,), "scaler": (dict, type(None))}


def _state_problem(state: object) -> str | None:
    """What makes `state` something other than a checkpoint save_checkpoint wrote, or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}"
    missing = [key for key in _STATE_KINDS if key not in state]
    if missing:
        return f"it has no {', '.join(repr(key) for key in missing)}"
    kinds = {**_STATE_KINDS, **{key: kind for key, kind in _OPTIONAL_KINDS.items() if key in state}}
    for key, kind in kinds.items():
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            return f"its {key!r} is a {type(state[key]).__name__}"
    if not all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state["model"].items()):
        return "its 'model' is not a state_dict of tensors"
    if not all(isinstance(entry, IterationDone) for entry in state["history"]):
        return "its 'history' holds entries other than nbscale's"
    if state["rng"].dtype != torch.uint8 or state["rng"].ndim != 1:
        return "its 'rng' is not a random-number generator state"
    if not {"state", "param_groups"} <= state["optimizer"].keys():
        return "its 'optimizer' is not an optimizer's state_dict"
    return None


def refuse_untrusted(
    path: Path, name: str, folder: bool, sticky_ok: bool = False, status: os.stat_result | None = None
) -> None:
    """OptionsError unless `path` belongs to this user (or root) and no one else can write to it.

    sticky_ok: a folder anyone can write to is accepted when it has the sticky bit (like /tmp), where others
    cannot rename or delete the user's files; used for the folder of a checkpoint file named directly.
    """
    if not posix_owners():  # Windows: ACLs, not owners and mode bits, say who may write (nbscale.trust)
        return
    status = status or path.stat()
    what = "folder" if folder else "file"
    if status.st_uid not in (os.getuid(), 0):
        raise OptionsError(
            f"{name}: the {what} {str(path)!r} belongs to another user (uid {status.st_uid}), who could have "
            "written a checkpoint that runs as you. Resume only from checkpoints in your own folders: copy a "
            "checkpoint you trust into one, or train from the start without resume_from."
        )
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and status.st_mode & stat.S_ISVTX):
        raise OptionsError(
            f"{name}: the {what} {str(path)!r} can be written by other users (mode {stat.filemode(status.st_mode)}),"
            f" who could plant or change a checkpoint. Make it yours alone (chmod go-w {str(path)!r}) if no one "
            "else wrote to it, or train from the start without resume_from."
        )


def prepare_folder(folder: str | os.PathLike[str]) -> None:
    """Create the checkpoint folder (0700) if needed and remove partial files of killed runs; OptionsError when it
    cannot hold checkpoints or others can write to it (before training starts, not after the first epoch)."""
    path = Path(folder).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise OptionsError(
            f"checkpoint_path={str(folder)!r} cannot be used as a folder ({error.strerror or error}): "
            "give a folder that exists or can be created, and that you can write to."
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OptionsError(f"checkpoint_path={str(folder)!r} is not writable: give a folder you can write to.")
    refuse_untrusted(path.resolve(), f"checkpoint_path={str(folder)!r}", folder=True)
    remove_stale_partials(path)


def remove_stale_partials(folder: Path, min_age_s: float = STALE_PARTIAL_S) -> list[Path]:
    """Remove nbscale's partial checkpoint files in `folder` that no live writer holds; returns those removed.

    Only this user's regular files named as nbscale names them, at least `min_age_s` old, whose flock can be
    taken (a writer holds it until it renames the file, and loses it when it dies, even by SIGKILL).
    """
    removed = []
    candidates = [
        *folder.glob(_PARTIAL_PATTERN),
        *(p for p in folder.glob(".partial-*.pt") if _EARLIER_PARTIAL.fullmatch(p.name)),
    ]
    for partial in candidates:
        try:
            descriptor = os.open(partial, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:  # renamed or removed meanwhile, or a link: not ours to touch
            continue
        try:
            status = os.fstat(descriptor)
            if (
                not stat.S_ISREG(status.st_mode)
                or (posix_owners() and status.st_uid != os.getuid())
                or time.time() - status.st_mtime < min_age_s
            ):
                continue
            if not try_lock(descriptor):  # a live run is writing it
                continue
            if os.path.samestat(status, os.lstat(partial)):  # still the file we checked and locked
                partial.unlink()
                removed.append(partial)
        except OSError:
            continue
        finally:
            os.close(descriptor)
    return removed
