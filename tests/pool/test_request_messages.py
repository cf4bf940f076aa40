"""Messages to a running request (nbscale.pool.plumbing.message_running_request, worker_context().next_message):
the notebook answers what a running call emitted, on real worker processes."""

from __future__ import annotations

from typing import Any

import pytest

import nbscale
from nbscale.pool.context import worker_context
from nbscale.pool.plumbing import message_running_request


@pytest.fixture(scope="module")
def pool():
    with nbscale.Pool(2, cpu=True, idle_timeout=0) as running:
        yield running


def _ask_three_times() -> list[Any]:
    """Emit a question, wait for the notebook's answer to it, three times; the answers, in order."""
    context = worker_context()
    answers = []
    for question in range(3):
        context.emit(question)
        answers.append(context.next_message())
    return answers


def _emit_and_return() -> None:
    worker_context().emit("done")


def test_every_worker_running_the_request_gets_each_message_in_order(pool):
    answered: list[int] = []

    def answer(rank: int, question: int) -> None:
        if rank == 0:  # one answer per question reaches both workers
            answered.append(question)
            message_running_request(pool, ("answer", question))

    assert pool.run(_ask_three_times, on_event=answer) == [[("answer", 0), ("answer", 1), ("answer", 2)]] * 2
    assert answered == [0, 1, 2]


def test_a_message_to_a_request_that_ended_never_reaches_the_next_one(pool):
    # answered while the call returns, or after: either way the answer is for that call alone
    pool.run(_emit_and_return, on_event=lambda rank, payload: message_running_request(pool, "stale"))
    message_running_request(pool, "late")  # no request is waited for: nothing is sent

    def answer(rank: int, question: int) -> None:
        if rank == 0:
            message_running_request(pool, question * 10)

    assert pool.run(_ask_three_times, on_event=answer) == [[0, 10, 20]] * 2
