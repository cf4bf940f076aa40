"""Every SIGINT policy (the kernel's interrupt), stated once here; the modules named call these.

In the notebook's process (the kernel):
- A message goes out whole: `HeldInterrupt` holds the interrupt while a frame is written (one landing mid-frame
  leaves half a frame on the socket) and between the ranks a request goes to (routing.py, tasks.py, pool.py).
  A second interrupt during a hold lands at once: a send to a peer that stopped reading would hold forever.
- A step that must finish once begun (the automatic restart) holds every interrupt, says `notice` for each and
  drops them (`HeldInterrupt(notice=...)`, waiting.py); stopping the pool runs every step even when interrupted,
  and a step cut short once runs again (`each_despite_interrupts`, pool.py).
- An interrupt while a blocking request waits interrupts the workers still running it and gives them a grace
  time; those that do not stop are replaced (waiting.py's `wait`, which states the grace times).
- Training asks to stop at the end of its iteration on the first interrupt and stops at once on the second; on
  the pool, the second comes by itself after a grace time (`graceful_interrupt`, used by training/trainer.py).

On a pool worker (worker.py):
- SIGINT raises KeyboardInterrupt only in the request that runs (`RequestGate`): one arriving between requests
  would end the worker's loop. The kernel interrupts a worker by sending SIGINT to its main thread
  (`interrupt_main_thread`), even in a blocking call.
- Every interrupt is held while a reply goes out, the second too (`hold_every_interrupt`): a reply cut short
  would garble the kernel's channel, and the kernel always reads what the worker sends.
- `pool.cancel`'s interrupt is told apart from the user's (`task_cancelled`): graceful code stops at once and
  silently for a cancel.

Holding: a KeyboardInterrupt is raised in the main thread between any two bytecodes, so one landing while a frame
is written to a socket leaves half a frame there. While a `HeldInterrupt` is active, SIGINT's Python handler only
notes the signal; `deliver` then lets it land through the handler it held off (KeyboardInterrupt by default, or
what the running code installed, such as training's "stop at the end of the iteration").
"""

from __future__ import annotations

# The C functions under `signal`'s getsignal/signal: the public ones also turn every handler they return into an
# enum member, which costs far more than the swap itself, and a hold swaps twice on every request and reply.
import _signal  # type: ignore[import-not-found]  # (no stub: the same signatures as signal's)
import _thread
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from nbscale.notices import notices

_task_cancelled = threading.Event()  # on a worker: the interrupt now landing is pool.cancel's


@dataclass
class _Holds:
    holding: HeldInterrupt | None = None  # the hold in force: one nested in it leaves the interrupt to it
    second_lands: bool = True  # whether a second interrupt during a hold lands at once (see `hold_every_interrupt`)


_holds = _Holds()


def hold_every_interrupt() -> None:
    """Hold a second interrupt too, in this process (a worker: its interrupts come from the kernel, which always
    reads what the worker sends, and a reply cut short would garble the kernel's channel)."""
    _holds.second_lands = False


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
        if _holds.holding is not None or threading.get_ident() != threading.main_thread().ident:
            return self  # held already, or not the main thread: no interrupt is raised in this one
        previous = _signal.getsignal(signal.SIGINT)
        if callable(previous):
            try:
                _signal.signal(signal.SIGINT, self._note)
            except ValueError:  # not the main interpreter's main thread after all
                return self
            self._previous, _holds.holding = previous, self
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._previous is not None:
            _signal.signal(signal.SIGINT, self._previous)
            self._previous, _holds.holding = None, None
        if self._notice is not None:
            self.pending = False  # dropped: the step that was held for is what the interrupts asked for
        elif not self._deliver_later:
            self.deliver()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._notice is not None:
            self.dropped += 1
            notices.warning(self._notice)
            return
        if (
            self.pending and _holds.second_lands
        ):  # a second interrupt: the user wants out now (a send that never ends, to a frozen peer)
            self.pending = False
            raise KeyboardInterrupt
        self.pending = True

    def deliver(self) -> None:
        """Let the interrupt held off land now, as if it arrived now (outside the `with` block)."""
        if self.pending:
            self.pending = False
            signal.raise_signal(signal.SIGINT)  # runs the handler in place now, in this thread


def each_despite_interrupts(steps: list[Callable[[], Any]]) -> bool:
    """Run every step; one a KeyboardInterrupt cuts short runs once more (each is safe to repeat). Whether an
    interrupt came."""
    interrupted = False
    for step in steps:
        for _ in range(2):
            try:
                step()
                break
            except KeyboardInterrupt:
                interrupted = True
    return interrupted


class RequestGate:
    """A worker's SIGINT handler: KeyboardInterrupt while `interruptible()` (the main thread runs a request's
    code), and nothing otherwise. An interrupt that comes late (a second one for a request already stopping, or
    one crossing its end) is dropped: raised in the loop that answers requests, it would end the worker."""

    def __init__(self, interruptible: Callable[[], bool]) -> None:
        self._interruptible = interruptible

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self._interruptible():
            raise KeyboardInterrupt


def interrupt_main_thread() -> None:
    """SIGINT to the main thread, which runs the requests: KeyboardInterrupt there, even in a blocking call."""
    main = threading.main_thread().ident
    assert main is not None  # the main thread has always started
    signal.pthread_kill(main, signal.SIGINT)


@contextlib.contextmanager
def graceful_interrupt(
    ask_to_stop: Callable[[], None],
    asked: Callable[[], bool],
    notice: str,
    force_after: tuple[float, Callable[[], bool]] | None = None,
) -> Iterator[Callable[[], bool]]:
    """The first interrupt calls `ask_to_stop()` and says `notice`; one after that (`asked()` is True), or any
    for a task `pool.cancel` interrupts, raises KeyboardInterrupt at once.

    `force_after=(grace_s, counting)`: if the block still runs `grace_s` seconds after the first interrupt
    (counted only while `counting()` is True), the second interrupt comes by itself. Yields a function that
    tells whether it did. Outside the main thread nothing is installed. A process forked in the block (a
    DataLoader's) inherits the handler, and the kernel's interrupt reaches its whole process group: only this
    process acts on it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    lock = threading.Lock()
    state = {"done": False, "forced": False}
    here = os.getpid()

    def force_when_stuck(grace_s: float, counting: Callable[[], bool]) -> None:
        waited = 0.0
        while waited < grace_s:
            time.sleep(0.1)
            if state["done"]:
                return
            if counting():
                waited += 0.1
        with lock:
            if not state["done"]:
                state["forced"] = True
                _thread.interrupt_main()  # runs on_interrupt in the main thread, which raises KeyboardInterrupt

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if state["done"] or os.getpid() != here:
            return
        if asked() or task_cancelled():  # pool.cancel of a task running this on a worker: nobody waits
            raise KeyboardInterrupt
        ask_to_stop()
        notices.warning(notice)  # the answer to the user's interrupt
        if force_after is not None:
            threading.Thread(target=force_when_stuck, args=force_after, name="nbscale-stop-grace", daemon=True).start()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: state["forced"]
    finally:
        with lock:
            state["done"] = True
        signal.signal(signal.SIGINT, previous)
