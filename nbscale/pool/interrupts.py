"""Holding the kernel interrupt off while a message goes out, so it goes out whole.

A KeyboardInterrupt (the kernel's interrupt, SIGINT) is raised in the main thread between any two bytecodes, so
one landing while a frame is written to a socket leaves half a frame there (the peer then reads the next message
as the rest of it), and one landing between the ranks a request goes to leaves some ranks without it. While a
`HeldInterrupt` is active, SIGINT's Python handler only notes the signal; `deliver` then lets it land through the
handler it held off (KeyboardInterrupt by default, or what the running code installed, such as training's
"stop at the end of the iteration"). A second interrupt while one is held lands at once, as a KeyboardInterrupt:
a send to a peer that stopped reading would otherwise hold the kernel forever.

`HeldInterrupt(notice=...)` holds every interrupt, the second too, says `notice` for each, and drops them at its
end: for a step that must finish once begun, such as the automatic restart of a pool whose workers did not stop
(an interrupt there left no pool at all).
"""

from __future__ import annotations

# The C functions under `signal`'s getsignal/signal: the public ones also turn every handler they return into an
# enum member, which costs far more than the swap itself, and a hold swaps twice on every request and reply.
import _signal  # type: ignore[import-not-found]  # (no stub: the same signatures as signal's)
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

_task_cancelled = threading.Event()  # on a worker: the interrupt now landing is pool.cancel's
_holding: HeldInterrupt | None = None  # the hold in force: one nested in it leaves the interrupt to it
_second_lands = True  # whether a second interrupt during a hold lands at once (see `hold_every_interrupt`)


def hold_every_interrupt() -> None:
    """Hold a second interrupt too, in this process (a worker: its interrupts come from the kernel, which always
    reads what the worker sends, and a reply cut short would garble the kernel's channel)."""
    global _second_lands
    _second_lands = False


def task_cancelled() -> bool:
    """On a pool worker: whether the interrupt landing now is `pool.cancel`'s, for a task whose result nobody
    waits for, rather than the user's interrupt of the kernel. Code that stops gracefully on the user's interrupt
    (training stops at the end of its iteration, and says so) stops at once and silently for a cancel."""
    return _task_cancelled.is_set()


def set_task_cancelled(cancelled: bool) -> None:
    """Set by the worker: before interrupting a task for pool.cancel (True), and when its request ends (False)."""
    if cancelled:
        _task_cancelled.set()
    else:
        _task_cancelled.clear()


class HeldInterrupt:
    """`with HeldInterrupt():` holds SIGINT off while the block runs and lets a held one land at its end;
    `HeldInterrupt(deliver_later=True)` leaves that to `deliver()`.

    Only the main thread runs Python signal handlers: elsewhere (and where SIGINT has no Python handler, so
    ignored or fatal) the block runs unchanged and nothing is held. A hold inside another holds nothing itself.
    """

    def __init__(self, deliver_later: bool = False, notice: str | None = None) -> None:
        self.pending = False
        self.dropped = 0  # interrupts held and dropped (with `notice`)
        self._deliver_later = deliver_later
        self._notice = notice
        self._previous: Any = None

    def __enter__(self) -> HeldInterrupt:
        global _holding
        if _holding is not None or threading.get_ident() != threading.main_thread().ident:
            return self  # held already, or not the main thread: no interrupt is raised in this one
        previous = _signal.getsignal(signal.SIGINT)
        if callable(previous):
            try:
                _signal.signal(signal.SIGINT, self._note)
            except ValueError:  # not the main interpreter's main thread after all
                return self
            self._previous, _holding = previous, self
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        global _holding
        if self._previous is not None:
            _signal.signal(signal.SIGINT, self._previous)
            self._previous, _holding = None, None
        if self._notice is not None:
            self.pending = False  # dropped: the step that was held for is what the interrupts asked for
        elif not self._deliver_later:
            self.deliver()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._notice is not None:
            self.dropped += 1
            print(self._notice, file=sys.stderr, flush=True)
            return
        if self.pending and _second_lands:  # a second interrupt: the user wants out now (a send that never ends, to a frozen peer)
            self.pending = False
            raise KeyboardInterrupt
        self.pending = True

    def deliver(self) -> None:
        """Let the interrupt held off land now, as if it arrived now (outside the `with` block)."""
        if self.pending:
            self.pending = False
            signal.raise_signal(signal.SIGINT)  # runs the handler in place now, in this thread
