"""How a lost worker is reported: the real exit status from the forkserver that started it, not a guess."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import nbscale
from nbscale.errors import WorkerError

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast


@pytest.fixture
def pool():
    with nbscale.Pool(2, cpu=True) as running:
        yield running


def test_a_sigkilled_worker_is_reported_as_killed_by_sigkill(pool):
    victim = pool.workers[1].pid
    assert pool.status().workers[1].memory_mb  # known while it lives
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError, match=rf"worker 1 \(pid {victim}\) died: it was killed by SIGKILL") as failed:
        pool.run(os.getpid)
    assert "%pool restart" in str(failed.value)
    assert [w.state for w in pool.workers] == ["idle", "dead"]
    shown = pool.status()
    assert [w.state for w in shown.workers] == ["idle", "dead"]
    assert shown.workers[0].memory_mb and shown.workers[1].memory_mb is None  # a dead process holds no memory


def test_a_worker_found_dead_between_the_check_and_the_send_fails_the_call_instead_of_hanging(pool, monkeypatch):
    """The receiver notices a killed worker just after pool.run checked every worker was alive (a busy machine:
    CI once waited 300 s here): the request, sent to a closed connection, fails at once, saying how it died."""
    victim = pool.workers[1].pid
    checked = pool._check_usable

    def check_then_kill(ranks):
        checked(ranks)  # every worker alive: the request goes out ...
        os.kill(victim, signal.SIGKILL)  # ... and worker 1 dies, noticed before it is sent to
        deadline = time.monotonic() + 30
        while pool.workers[1].state != "dead":
            assert time.monotonic() < deadline
            time.sleep(0.01)

    monkeypatch.setattr(pool, "_check_usable", check_then_kill)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=rf"worker 1 \(pid {victim}\) died: it was killed by SIGKILL"):
        pool.run(os.getpid)
    assert time.monotonic() - started < 30
    assert pool._group.router.workers[1].outstanding == 0  # the dead worker holds no request


def test_a_worker_that_exits_is_reported_with_its_exit_code(pool):
    with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) died: it exited with code 3"):
        pool.run(os._exit, 3, targets=[0])
    with pytest.raises(WorkerError, match=r"Worker 0 .* died: it exited with code 3. Run %pool restart"):
        pool.run(os.getpid)  # later requests say the same
    pool.restart()
    assert len(set(pool.run(os.getpid))) == 2


def test_tasks_a_restart_ends_say_the_pool_was_restarted_not_stopped(pool):
    running = [pool.submit(time.sleep, 60) for _ in range(2)]  # one on each worker
    queued = pool.submit(time.sleep, 60)
    time.sleep(1)
    pool.restart()
    for future in running:
        with pytest.raises(WorkerError, match="the pool was restarted before it finished: run it again"):
            future.result(timeout=10)
    with pytest.raises(nbscale.PoolError, match="The task did not run: the pool was restarted; submit it again."):
        queued.result(timeout=10)
    assert len(set(pool.run(os.getpid))) == 2


def _raise_on_rank_one_else_sleep() -> None:
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 gave up")
    time.sleep(60)


@pytest.mark.slow
def test_an_error_on_one_rank_stops_the_others_instead_of_leaving_them_waiting(pool):
    started, pids = time.monotonic(), pool.run(os.getpid)
    with pytest.raises(ValueError, match="rank 1 gave up") as failed:  # the WorkerError is also a ValueError
        pool.spmd("import torch\nif rank == 1:\n    raise ValueError('rank 1 gave up')\nallreduce(torch.ones(1))\n")
    assert time.monotonic() - started < 15  # not gloo's 30-minute timeout
    message = str(failed.value)
    assert message.startswith("The cell failed on rank 1 (of 2 workers).")
    assert "Worker 0 was still running 2 s after rank 1 failed (a collective waits for every rank)" in message
    assert "so the pool was restarted with fresh workers" in message  # a rank stuck in gloo cannot be interrupted
    namespace: dict = {}
    pool.spmd("total = allreduce(rank + 1)", namespace=namespace)
    assert namespace["total"][:] == [3, 3]
    assert pool.run(os.getpid) != pids
    pids, started = pool.run(os.getpid), time.monotonic()
    with pytest.raises(ValueError, match="(?s)rank 1 gave up.*Worker 0 was still running .* so it was interrupted\\.$"):
        pool.run(_raise_on_rank_one_else_sleep)  # a sleep stops when interrupted: the same workers go on
    assert time.monotonic() - started < 10 and pool.run(os.getpid) == pids


def test_a_task_running_beside_a_call_that_fails_is_kept(pool):
    task = pool.submit(time.sleep, 3)  # on a free worker: the call waits there until the task ends
    time.sleep(0.3)
    with pytest.raises(ValueError, match="rank 1 gave up"):
        pool.run(_raise_on_rank_one_else_sleep)
    assert task.result(timeout=10) is None  # the call was skipped there, the task not interrupted


def test_tasks_on_a_pool_whose_workers_all_died_fail_instead_of_waiting_forever(pool):
    queued = [pool.submit(time.sleep, 60) for _ in range(3)]  # two running, one waiting for a free worker
    for worker in pool.workers:
        os.kill(worker.pid, signal.SIGKILL)
    for future in queued:
        with pytest.raises(Exception, match="killed by SIGKILL"):
            future.result(timeout=30)
    with pytest.raises(Exception, match=r"every worker of the pool has died \(worker 0: .*SIGKILL.*Run %pool restart"):
        pool.submit(os.getpid).result(timeout=30)
    with pytest.raises(Exception, match="Run %pool restart"):
        list(pool.map(abs, [-1, -2]))
    pool.restart()
    assert list(pool.map(abs, [-1, -2])) == [1, 2]
