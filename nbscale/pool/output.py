"""Workers' printed output in the notebook: each line prefixed with its rank, progress bars redrawn in place."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from nbscale.pool import protocol as p

_open_line: dict[str, int] = {}  # stream name -> rank whose last line has not ended yet (no newline so far)
# stream name -> rank -> that rank's unfinished line (from its last redraw "\r..." on), held while another rank's
# is live
_held_lines: dict[str, dict[int, str]] = {}
# stream name -> ranks whose open line another rank's output ended: the newline that would end it is that one
_ended_by_others: dict[str, set[int]] = {}
_unflushed: set[str] = set()  # streams written since their last flush
# stream name -> other ranks' output that waits, in order, for the open line to end (see print_output)
_waiting: dict[str, list[p.Output]] = {}
_opened: dict[str, tuple[float, bool]] = {}  # stream name -> when its open line began, and whether it is plain text
_PATIENCE_S = 1.0  # how long finished lines of other ranks wait for an open plain line ("loading..." then " ok")


def print_output(output: p.Output, flush: bool = True) -> None:
    """A worker's output, each line prefixed with its rank, also after a carriage return.

    A chunk that does not end its line (`print(..., end="", flush=True)`, a tqdm bar redrawn after "\r") leaves the
    line open: the same rank's next chunk continues it (the notebook redraws a "\r" line in place), and other
    output ends it first. A notebook stream can redraw only its last line, so while one rank's line is open, other
    ranks' unfinished lines are held (a progress bar's latest redraw) and shown when their line ends or the request
    does: several ranks' progress bars make one line each, not one line per redraw. A rank's finished line waits
    (up to _PATIENCE_S, then until more output or the request's end) while another rank's plain open line is
    young, so `print('loading', end='')` then `print(' ok')` on every rank makes one line per rank whichever rank
    ends first. With `flush=False` the caller calls `flush_output()`
    once a burst has been written: in a kernel each flush is a round trip to its output thread and one message to
    the notebook, so flushing every line of a worker that prints thousands is slow.
    """
    name = output.stream
    if _waiting.get(name) and not _worth_waiting(name):
        _release(name)
    waiting = _waiting.setdefault(name, [])
    open_rank = _open_line.get(name)
    if any(earlier.rank == output.rank for earlier in waiting) or (
        output.text.endswith("\n") and open_rank not in (None, output.rank) and _worth_waiting(name)
    ):
        # a rank's line ends while another rank's plain line is still open (every rank printing "loading", then
        # " ok"): it waits a moment for that line to end, so neither is cut in two
        waiting.append(output)
        return
    _show(output, flush)
    if name not in _open_line and waiting:
        _release(name)
        if flush:
            flush_output()


def _worth_waiting(name: str) -> bool:
    """Whether the stream's open line is plain text (no redraw) opened within the patience."""
    began, plain = _opened.get(name, (0.0, False))
    return name in _open_line and plain and time.monotonic() - began < _PATIENCE_S


def _release(name: str) -> None:
    """Show what waited for the open line, in the order it came."""
    for output in _waiting.pop(name, []):
        _show(output, flush=False)


def _show(output: p.Output, flush: bool) -> None:
    stream = sys.stderr if output.stream == "stderr" else sys.stdout
    held = _held_lines.setdefault(output.stream, {})
    if "\n" not in output.text and _open_line.get(output.stream, output.rank) != output.rank:
        unfinished = held.get(output.rank, "") + output.text
        held[output.rank] = unfinished[unfinished.rfind("\r"):] if "\r" in unfinished else unfinished
        return
    earlier = held.pop(output.rank, "")
    if earlier:
        _write(stream, output.stream, output.rank, earlier)  # the line as it stood, before what goes on with it
    _write(stream, output.stream, output.rank, output.text)
    if flush:
        flush_output()


def _write(stream: TextIO, name: str, rank: int, text: str) -> None:
    ended = _ended_by_others.setdefault(name, set())
    if rank in ended:
        ended.discard(rank)
        if text.startswith("\n"):  # tqdm's close or a final print() of a line another rank's output has ended
            text = text[1:]
            if not text:
                return
    open_rank = _open_line.pop(name, None)
    continues = open_rank == rank
    if open_rank is not None and not continues:
        stream.write("\n")  # another rank's unfinished line ends here
        ended.add(open_rank)
    lines = text.split("\n")
    stream.write("\n".join(_prefixed(line, rank, continued=continues and i == 0)
                           if line or i < len(lines) - 1 else line for i, line in enumerate(lines)))
    if text and not text.endswith("\n"):
        _open_line[name] = rank
        if not continues or "\n" in text:
            _opened[name] = (time.monotonic(), "\r" not in text)
        elif "\r" in text:
            _opened[name] = (_opened.get(name, (0.0, False))[0], False)
    _unflushed.add(name)


def end_open_lines() -> None:
    """Show held unfinished lines and end the lines workers left open (a request ended): the next cell's output
    starts on a line of its own."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        _release(name)
        held = _held_lines.pop(name, {})
        _ended_by_others.pop(name, None)
        for rank in sorted(held):
            _write(stream, name, rank, held[rank])
        if _open_line.pop(name, None) is not None:
            stream.write("\n")
            _unflushed.add(name)
    flush_output()


def flush_output() -> None:
    """Flush the streams `print_output` wrote to since their last flush."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        if name in _unflushed:  # discard, not pop: the receiver thread may print (and flush) at the same time
            _unflushed.discard(name)
            stream.flush()


def _prefixed(line: str, rank: int, continued: bool) -> str:
    """`line` with its rank before it (unless it `continued` the rank's open line) and before each redraw after a
    carriage return."""
    pieces = line.split("\r")
    return "\r".join(piece if (i == 0 and continued) or not (piece or len(pieces) == 1) else f"[{rank}] {piece}"
                     for i, piece in enumerate(pieces))
