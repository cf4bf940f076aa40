"""Futures with events, cancelling a running task, and stopping one task: nbscale.pool.plumbing's
submit_with_events, cancel, request_stop(future), on real worker processes."""

from __future__ import annotations

import io
import itertools
import os
import random
import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest

import nbscale
from nbscale.pool.context import worker_context
from nbscale.pool.plumbing import submit_with_events


@pytest.fixture(scope="module")
def pool():
    with nbscale.Pool(1, cpu=True) as running:
        yield running


def _count_until_stopped(limit: int) -> int:
    context = worker_context()
    for step in range(limit):
        context.emit(step)
        if context.stop_requested:
            return step
        time.sleep(0.02)
    return limit


def test_submit_with_events_delivers_every_event_on_the_receiver_thread(pool):
    seen: list[tuple[int, int, str]] = []
    future = submit_with_events(
        pool, _count_until_stopped, lambda rank, step: seen.append((rank, step, threading.current_thread().name)), 5
    )
    assert future.result(timeout=30) == 5
    assert [step for _, step, _ in seen] == [0, 1, 2, 3, 4]
    assert {(rank, thread) for rank, _, thread in seen} == {(0, "nbscale-pool-receiver")}


def test_cancelling_a_running_task_frees_its_worker_for_the_queued_one(pool):
    started = threading.Event()
    running = submit_with_events(pool, _count_until_stopped, lambda rank, step: started.set(), 100000)
    queued = pool.submit(os.getpid)
    assert started.wait(30)
    assert pool.cancel(running)
    # cancelled at once, as concurrent.futures cancels a pending future: every view agrees
    assert running.cancelled() and running.done()
    with pytest.raises(CancelledError):
        running.result(timeout=30)
    with pytest.raises(CancelledError):
        running.exception(timeout=30)
    assert queued.result(timeout=30) == pool.workers[0].pid  # the one worker took the queued task
    assert not pool.cancel(queued)  # already finished
    assert pool.cancel(running) and running.cancelled()  # cancelling again changes nothing


def _emit_each_iteration(info) -> None:
    worker_context().emit(info.iteration)


def _train_for_long() -> None:
    import nbscale
    from tests.training.digits import digits, tiny_net

    (x, y), _ = digits()
    options = nbscale.TrainingOptions(
        "sgdm",
        mini_batch_size=32,
        max_epochs=100000,
        execution_environment="cpu",
        plots="none",
        verbose=False,
        output_fn=_emit_each_iteration,
    )
    nbscale.train(tiny_net(), (x, y), options)


def test_cancelling_a_task_that_trains_stops_it_at_once_without_the_interrupt_message(pool, capfd):
    """Training stops gracefully on the user's interrupt, saying so; a cancel is nobody's interrupt."""
    started = threading.Event()
    running = submit_with_events(pool, _train_for_long, lambda rank, iteration: started.set())
    assert started.wait(120), "the training did not start"
    assert pool.cancel(running) and running.cancelled()
    assert pool.submit(sum, [2, 3]).result(timeout=60) == 5  # the worker stopped and is free
    output = capfd.readouterr()
    assert "Stopping at the end of this iteration" not in output.out + output.err


def _lose_the_first_interrupt() -> None:
    """Stands for a cancel's interrupt lost on its way (one landing as the task starts, on a busy machine): the
    first SIGINT is swallowed, the next stops the task."""
    import signal

    interrupts: list[int] = []

    def swallow_the_first(signum, frame):
        interrupts.append(signum)
        if len(interrupts) > 1:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, swallow_the_first)
    worker_context().emit("started")
    while True:
        time.sleep(0.01)


def test_a_cancelled_task_whose_interrupt_was_lost_is_interrupted_again_and_its_worker_freed(pool):
    started = threading.Event()
    running = submit_with_events(pool, _lose_the_first_interrupt, lambda rank, payload: started.set())
    assert started.wait(30)
    assert pool.cancel(running) and running.cancelled()
    assert pool.submit(sum, [2, 3]).result(timeout=60) == 5  # the task stopped on the Interrupt sent again


def test_cancelling_a_queued_task_means_it_never_runs(pool):
    started = threading.Event()
    running = submit_with_events(pool, _count_until_stopped, lambda rank, step: started.set(), 100000)
    queued = pool.submit(os.getpid)
    assert pool.cancel(queued) and queued.cancelled()
    assert started.wait(30)
    pool.request_stop(running)
    assert running.result(timeout=30) < 100000  # stopped early through worker_context().stop_requested
    assert pool.submit(sum, [2, 3]).result(timeout=30) == 5


def test_leaving_a_map_early_interrupts_its_running_items_and_frees_the_worker(pool, capsys):
    results = pool.map(time.sleep, [0, 600, 600])
    assert next(results) is None
    results.close()  # as when the loop over it is interrupted or left with break
    assert pool.submit(os.getpid).result(timeout=60) == pool.workers[0].pid


def test_map_draws_items_a_few_per_worker_ahead_of_the_results_taken(pool):
    drawn = []

    def endless():
        for item in itertools.count():
            drawn.append(item)
            yield item

    results = pool.map(abs, endless())
    assert len(drawn) <= 2 * pool.size + 1  # submitted at the call, before any result is taken
    assert [next(results) for _ in range(10)] == list(range(10))
    assert len(drawn) <= 10 + 2 * pool.size + 1
    results.close()


def test_a_blocking_call_behind_a_running_task_says_what_it_waits_for(pool, monkeypatch):
    started = threading.Event()
    running = submit_with_events(pool, _count_until_stopped, lambda rank, step: started.set(), 100000)
    assert started.wait(30)

    class StopTheTaskOnceToldWhy(io.StringIO):
        def write(self, text: str) -> int:
            if "still running a task" in text:
                pool.request_stop(running)
            return super().write(text)

    printed = StopTheTaskOnceToldWhy()
    monkeypatch.setattr(sys, "stdout", printed)
    assert pool.run(os.getpid) == [pool.workers[0].pid]
    assert "Worker 0 still running a task from pool.submit or pool.map" in printed.getvalue()


def test_interrupts_that_cross_the_end_of_a_request_never_end_the_worker(pool):
    """A second interrupt for a task already stopping, or one landing just as a request ends, is dropped by the
    worker, not raised in the loop that answers requests (which would end the worker: the kernel then waited
    forever on a pool with no live worker)."""
    from nbscale.pool import protocol as p

    pid = pool.workers[0].pid
    stop = threading.Event()

    def storm() -> None:
        while not stop.is_set():  # untargeted, as the kernel's interrupt of a cell sends them, at uneven intervals
            pool._group.router.tell(p.Interrupt(None))  # (so that some land while the worker answers an earlier one)
            time.sleep(random.uniform(0.00002, 0.0005))

    storming = threading.Thread(target=storm)
    storming.start()
    try:
        outcomes = {"done": 0, "interrupted": 0}
        for _ in range(300):
            try:
                pool.submit(time.sleep, 0.002).result(timeout=30)
                outcomes["done"] += 1
            except Exception as error:  # a task the storm interrupted fails with KeyboardInterrupt
                assert "KeyboardInterrupt" in str(error), error
                outcomes["interrupted"] += 1
    finally:
        stop.set()
        storming.join()
    assert pool.workers[0].state != "dead" and pool.run(os.getpid) == [pid], outcomes
