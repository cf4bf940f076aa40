"""Workers' printed output in the notebook: each line prefixed with its rank, progress bars redrawn in place.

Relaying stays bounded in the kernel: workers can print far faster than a notebook reads (1 GB of output once left
the kernel 1.45 GB larger, held by ipykernel and ZeroMQ). At most QUEUED_OUTPUT_CHARS wait to be shown, and after
a first burst of that size output goes on at RELAYED_CHARS_PER_S; what comes past that is left out with one line
saying how much. The notebook's stream is flushed every FLUSH_CHARS.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
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


@dataclass
class _Written:
    chars: int = 0  # written since the last flush


_written = _Written()
_PATIENCE_S = 1.0  # how long finished lines of other ranks wait for an open plain line ("loading..." then " ok")
QUEUED_OUTPUT_CHARS = 8 * 2**20  # a request's output waiting to be shown, at most (the rest is left out, counted)
# what the kernel sends faster than the notebook reads waits in the kernel (ipykernel and ZeroMQ keep it all):
# past a first burst, output reaches the notebook at most this fast: what Jupyter's server passes by default
RELAYED_CHARS_PER_S = 2**20
NOTICE_EVERY_S = 5.0  # while output is being left out, a notice at most this often (and one at the request's end)
FLUSH_CHARS = 2**16  # a kernel holds what was written until a flush, then up to 1000 messages in its IOPub queue


class OutputBacklog:
    """The output waiting in one request's inbox for the notebook, bounded: the receiver thread `admit`s each
    Output as it arrives, the caller's thread says what it `took`. Past QUEUED_OUTPUT_CHARS waiting, or past
    RELAYED_CHARS_PER_S after a first burst of that size, output is left out and counted; one notice says how much
    once output is admitted again, or when the request's reply comes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queued_chars = 0
        self.dropped_chars = 0
        # a token bucket: past a burst of QUEUED_OUTPUT_CHARS, RELAYED_CHARS_PER_S reach the notebook
        self._allowance, self._since = float(QUEUED_OUTPUT_CHARS), time.monotonic()
        self._noticed = self._since  # when the last notice was given

    def admit(self, output: p.Output) -> list[p.Output]:
        """What to put in the inbox for `output`: itself (after a notice of what was left out), or nothing."""
        with self._lock:
            now = time.monotonic()
            self._allowance = min(QUEUED_OUTPUT_CHARS, self._allowance + (now - self._since) * RELAYED_CHARS_PER_S)
            self._since = now
            if self.queued_chars + len(output.text) > QUEUED_OUTPUT_CHARS or len(output.text) > self._allowance:
                self.dropped_chars += len(output.text)
                return []
            self.queued_chars += len(output.text)
            self._allowance -= len(output.text)
        notice = self.notice(output.rank) if now - self._noticed >= NOTICE_EVERY_S else None
        return [notice, output] if notice is not None else [output]

    def took(self, output: p.Output) -> None:
        with self._lock:
            self.queued_chars -= len(output.text)

    def notice(self, rank: int) -> p.Output | None:
        """The line saying how much output was left out since the last notice (None if nothing was)."""
        with self._lock:
            dropped, self.dropped_chars = self.dropped_chars, 0
            self._noticed = time.monotonic()
        if not dropped:
            return None
        notice = p.Output(
            rank,
            "stderr",
            f"[nbscale] {dropped / 2**20:.1f} MB of the workers' output left out here: "
            f"they printed faster than the notebook shows (after the first {QUEUED_OUTPUT_CHARS // 2**20} "
            f"MB, {RELAYED_CHARS_PER_S // 2**20} MB/s). Write large output to a file.\n",
        )
        with self._lock:
            self.queued_chars += len(notice.text)  # it waits in the inbox too; `took` counts it off
        return notice


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
        held[output.rank] = unfinished[unfinished.rfind("\r") :] if "\r" in unfinished else unfinished
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
    stream.write(
        "\n".join(
            _prefixed(line, rank, continued=continues and i == 0) if line or i < len(lines) - 1 else line
            for i, line in enumerate(lines)
        )
    )
    if text and not text.endswith("\n"):
        _open_line[name] = rank
        if not continues or "\n" in text:
            _opened[name] = (time.monotonic(), "\r" not in text)
        elif "\r" in text:
            _opened[name] = (_opened.get(name, (0.0, False))[0], False)
    _unflushed.add(name)
    _written.chars += len(text)
    if _written.chars > FLUSH_CHARS:
        flush_output()


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
    _written.chars = 0
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        if name in _unflushed:  # discard, not pop: the receiver thread may print (and flush) at the same time
            _unflushed.discard(name)
            stream.flush()


def _prefixed(line: str, rank: int, continued: bool) -> str:
    """`line` with its rank before it (unless it `continued` the rank's open line) and before each redraw after a
    carriage return."""
    pieces = line.split("\r")
    return "\r".join(
        piece if (i == 0 and continued) or not (piece or len(pieces) == 1) else f"[{rank}] {piece}"
        for i, piece in enumerate(pieces)
    )
