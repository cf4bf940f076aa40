"""Holding the interrupt off while a message goes out: real SIGINTs, each scenario in a fresh Python process.

Signal handlers are process-wide state, so each scenario runs where a kernel's process starts: SIGINT raising
KeyboardInterrupt, whatever this test process inherited (a test run started in the background ignores SIGINT).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import nbscale

_PRELUDE = """
import os, signal, time
from nbscale.pool.interrupts import HeldInterrupt

# as in a kernel, whose interrupt raises KeyboardInterrupt: a process started from a background job inherits
# SIGINT ignored, and Python then installs no handler of its own (nor is there one for a hold to hold off)
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupt_this_process():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler would run here, part-way through the block, without the hold
"""


def _scenario(body: str) -> list[str]:
    """What a fresh process running `body` (after the prelude) printed, line by line."""
    script = _PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=str(nbscale.__path__[0] + "/..")
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_an_interrupt_during_a_hold_lands_once_the_block_has_run_whole():
    assert _scenario("""
        try:
            with HeldInterrupt():
                interrupt_this_process()
                print("rest-of-the-block")
        except KeyboardInterrupt:
            print("interrupted")
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """) == ["rest-of-the-block", "interrupted", "True"]


def test_a_hold_inside_another_leaves_the_interrupt_to_the_outer_one():
    assert _scenario("""
        try:
            with HeldInterrupt():
                with HeldInterrupt():
                    interrupt_this_process()
                print("after-the-inner-hold")
        except KeyboardInterrupt:
            print("interrupted")
    """) == ["after-the-inner-hold", "interrupted"]


def test_an_interrupt_held_for_later_lands_when_delivered():
    assert _scenario("""
        held = HeldInterrupt(deliver_later=True)
        with held:
            interrupt_this_process()
        print("pending", held.pending)
        try:
            held.deliver()
        except KeyboardInterrupt:
            print("delivered")
        held.deliver()  # once only
        print("once")
    """) == ["pending", "True", "delivered", "once"]


def test_a_held_interrupt_lands_through_the_handler_the_running_code_installed():
    assert _scenario("""
        calls = []
        signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))  # as training's "stop"
        with HeldInterrupt():
            interrupt_this_process()
            print("inside", len(calls))
        print("after", len(calls))
    """) == ["inside", "0", "after", "1"]


def test_a_second_interrupt_during_a_hold_lands_at_once():
    assert _scenario("""
        try:
            with HeldInterrupt():
                interrupt_this_process()
                print("after-the-first")
                interrupt_this_process()
                print("after-the-second")
        except KeyboardInterrupt:
            print("interrupted")
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """) == ["after-the-first", "interrupted", "True"]
