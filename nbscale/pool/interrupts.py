"""Holding the kernel interrupt off while a message goes out, so it goes out whole.

A KeyboardInterrupt (the kernel's interrupt, SIGINT) is raised in the main thread between any two bytecodes, so
one landing while a frame is written to a socket leaves half a frame there (the peer then reads the next message
as the rest of it), and one landing between the ranks a request goes to leaves some ranks without it. While a
`HeldInterrupt` is active, SIGINT's Python handler only notes the signal; `deliver` then lets it land through the
handler it held off (KeyboardInterrupt by default, or what the running code installed, such as training's
"stop at the end of the iteration"). Held interrupts nest: an inner one delivers to the outer one.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any


class HeldInterrupt:
    """`with HeldInterrupt() as held:` holds SIGINT off in the block; `held.deliver()` lets a held one land.

    Only the main thread runs Python signal handlers: elsewhere (and where SIGINT has no Python handler, so
    ignored or fatal) the block runs unchanged and nothing is held.
    """

    def __init__(self) -> None:
        self.pending = False
        self._previous: Any = None

    def __enter__(self) -> HeldInterrupt:
        previous = signal.getsignal(signal.SIGINT)
        if callable(previous):
            try:
                signal.signal(signal.SIGINT, self._note)
            except ValueError:  # not the main thread: no interrupt is raised in this one
                return self
            self._previous = previous
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def deliver(self) -> None:
        """Let the interrupt held off land now, as if it arrived now (call outside the `with` block)."""
        if self.pending:
            self.pending = False
            signal.raise_signal(signal.SIGINT)  # runs the handler in place now, in this thread


@contextlib.contextmanager
def interrupts_after() -> Iterator[None]:
    """Run the block whole, then let an interrupt that arrived meanwhile land (at the end of the block)."""
    held = HeldInterrupt()
    try:
        with held:
            yield
    finally:
        held.deliver()
