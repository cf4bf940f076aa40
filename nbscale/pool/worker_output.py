"""A worker's output and tracebacks as the notebook shows them: stdout and stderr sent to the kernel line by line,
and a user's traceback without the library's frames."""

from __future__ import annotations

import io
import os
import sysconfig
import threading
import traceback

import torch

from nbscale.pool import protocol as p
from nbscale.pool.channel import Channel

_NBSCALE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# torch's module-call plumbing and the collectives' inside (distributed/): a failing broadcast shows the user's line
_TORCH_CALL_PLUMBING = tuple(
    os.path.join(os.path.dirname(torch.__file__), *parts)
    for parts in (("nn", "modules", "module.py"), ("nn", "parallel", "distributed.py"), ("distributed", ""))
)
_HIDDEN_FILES = (_NBSCALE_DIR, *_TORCH_CALL_PLUMBING)  # what a user's traceback leaves out
LIBRARY_DIRS = tuple({_NBSCALE_DIR, *(sysconfig.get_path(name) for name in ("stdlib", "purelib", "platlib"))})


_PENDING_CHARS = 64 * 1024  # the most of an unfinished line a worker keeps before sending it


class StreamToKernel(io.TextIOBase):
    """sys.stdout/sys.stderr replacement: sends whole lines to the kernel as Output messages."""

    def __init__(self, channel: Channel, rank: int, name: str) -> None:
        self._channel, self._rank, self._name = channel, rank, name
        self._pending = ""
        self._lock = threading.Lock()

    def forget_parent_after_fork(self) -> None:
        """In a child the user's code forked: the parent's unfinished line and its thread's hold on the lock are
        the parent's (a hold by a thread the child does not have would block the child's first print forever)."""
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            pending = self._pending + text
            if "\n" in text:
                complete, _, pending = pending.rpartition("\n")
                self._send(complete + "\n")
            if "\r" in pending:  # a redraw replaces the line so far, in the notebook too: only the latest is kept
                pending = pending[pending.rfind("\r") :]
            if len(pending) > _PENDING_CHARS:  # a long unfinished line goes in pieces (it stays one line there)
                self._send(pending)
                pending = ""
            self._pending = pending
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                text, self._pending = self._pending, ""
                self._send(text)

    def _send(self, text: str) -> None:
        try:
            self._channel.send(p.Output(self._rank, self._name, text))
        except OSError:
            pass


def user_traceback(error: BaseException) -> str:
    """The traceback as Python prints it, without nbscale's own frames and torch's module-call plumbing
    (nn.Module.__call__, DistributedDataParallel's forward: several frames a layer, torch.distributed's
    collectives), so the user sees their cell's and model's lines. An exception with no frame of the user's
    (one nbscale raised itself) is its message alone, without an empty traceback."""
    summary = traceback.TracebackException.from_exception(error)
    _drop_library_frames(summary)
    return "".join(summary.format())


def _drop_library_frames(summary: traceback.TracebackException) -> None:
    """Filters the stack of `summary` and of every exception chained to it or grouped in it, in place."""
    summary.stack[:] = [frame for frame in summary.stack if not frame.filename.startswith(_HIDDEN_FILES)]
    for linked in (summary.__cause__, summary.__context__, *(summary.exceptions or ())):
        if linked is not None:
            _drop_library_frames(linked)
