"""Workers' printed output in the notebook: each line prefixed with its rank, progress bars redrawn in place."""

from __future__ import annotations

import sys

from nbscale.pool import protocol as p

_open_progress_line: dict[str, int] = {}  # stream name -> rank whose progress line (redrawn after "\r") is open
_unflushed: set[str] = set()  # streams written since their last flush


def print_output(output: p.Output, flush: bool = True) -> None:
    """A worker's output, each line prefixed with its rank, also after a carriage return.

    A chunk that redraws a line after "\r" and does not end it (a tqdm bar) leaves the line open, so the notebook
    redraws it in place; other output ends an open line first. With `flush=False` the caller calls
    `flush_output()` once a burst has been written: in a kernel each flush is a round trip to its output thread
    and one message to the notebook, so flushing every line of a worker that prints thousands is slow.
    """
    stream = sys.stderr if output.stream == "stderr" else sys.stdout
    text = output.text
    open_rank = _open_progress_line.pop(output.stream, None)
    if open_rank is not None and not (open_rank == output.rank and text.startswith("\r")):
        stream.write("\n")
        if open_rank == output.rank and text.startswith("\n"):
            text = text[1:]  # the newline that ends the progress line (tqdm's close, a final print()) is that one
    lines = text.split("\n")
    stream.write("\n".join(_prefixed(line, output.rank) if line or i < len(lines) - 1 else line
                           for i, line in enumerate(lines)))
    if text and not text.endswith("\n"):
        if "\r" in text:
            _open_progress_line[output.stream] = output.rank
        else:
            stream.write("\n")
    _unflushed.add(output.stream)
    if flush:
        flush_output()


def flush_output() -> None:
    """Flush the streams `print_output` wrote to since their last flush."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        if name in _unflushed:  # discard, not pop: the receiver thread may print (and flush) at the same time
            _unflushed.discard(name)
            stream.flush()


def _prefixed(line: str, rank: int) -> str:
    """`line` with its rank before it and before each redraw after a carriage return."""
    pieces = line.split("\r")
    return "\r".join(f"[{rank}] {piece}" if piece or len(pieces) == 1 else piece for piece in pieces)
