"""Workers' printed output in the notebook: each line prefixed with its rank, progress bars redrawn in place."""

from __future__ import annotations

import sys

from nbscale.pool import protocol as p

_open_line: dict[str, int] = {}  # stream name -> rank whose last line has not ended yet (no newline so far)
_unflushed: set[str] = set()  # streams written since their last flush


def print_output(output: p.Output, flush: bool = True) -> None:
    """A worker's output, each line prefixed with its rank, also after a carriage return.

    A chunk that does not end its line (`print(..., end="", flush=True)`, a tqdm bar redrawn after "\r") leaves the
    line open: the same rank's next chunk continues it (the notebook redraws a "\r" line in place), and other
    output ends it first. With `flush=False` the caller calls `flush_output()` once a burst has been written: in a
    kernel each flush is a round trip to its output thread and one message to the notebook, so flushing every line
    of a worker that prints thousands is slow.
    """
    stream = sys.stderr if output.stream == "stderr" else sys.stdout
    text = output.text
    open_rank = _open_line.pop(output.stream, None)
    continues = open_rank == output.rank
    if open_rank is not None and not continues:
        stream.write("\n")  # another rank's unfinished line ends here
    lines = text.split("\n")
    stream.write("\n".join(_prefixed(line, output.rank, continued=continues and i == 0)
                           if line or i < len(lines) - 1 else line for i, line in enumerate(lines)))
    if text and not text.endswith("\n"):
        _open_line[output.stream] = output.rank
    _unflushed.add(output.stream)
    if flush:
        flush_output()


def end_open_lines() -> None:
    """End the lines workers left open (a request ended): the next cell's output starts on a line of its own."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
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
