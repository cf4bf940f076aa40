"""Holding the interrupt off while a message goes out: real SIGINTs to this process, in its main thread."""

from __future__ import annotations

import os
import signal
import time

import pytest

from nbscale.pool.interrupts import HeldInterrupt


def _interrupt_this_process() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler would run here, part-way through the block, without the hold


def test_an_interrupt_during_a_hold_lands_once_the_block_has_run_whole():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with HeldInterrupt():
            _interrupt_this_process()
            steps.append("rest of the block")
    assert steps == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_hold_inside_another_leaves_the_interrupt_to_the_outer_one():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with HeldInterrupt():
            with HeldInterrupt():
                _interrupt_this_process()
            steps.append("after the inner hold")
    assert steps == ["after the inner hold"]


def test_an_interrupt_held_for_later_lands_when_delivered():
    held = HeldInterrupt(deliver_later=True)
    with held:
        _interrupt_this_process()
    assert held.pending
    with pytest.raises(KeyboardInterrupt):
        held.deliver()
    held.deliver()  # once only


def test_a_held_interrupt_lands_through_the_handler_the_running_code_installed():
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))  # as training's "stop"
    try:
        with HeldInterrupt():
            _interrupt_this_process()
            assert calls == []
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_second_interrupt_during_a_hold_lands_at_once():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with HeldInterrupt():
            _interrupt_this_process()
            steps.append("after the first")
            _interrupt_this_process()
            steps.append("after the second")
    assert steps == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
