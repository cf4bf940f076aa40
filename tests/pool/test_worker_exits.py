"""How a lost worker is reported: the real exit status from the forkserver that started it, not a guess."""

from __future__ import annotations

import os
import signal

import pytest

import nbscale
from nbscale.errors import WorkerError


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


def test_a_worker_that_exits_is_reported_with_its_exit_code(pool):
    with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) died: it exited with code 3"):
        pool.run(os._exit, 3, targets=[0])
    with pytest.raises(WorkerError, match=r"Worker 0 .* died: it exited with code 3. Run %pool restart"):
        pool.run(os.getpid)  # later requests say the same
    pool.restart()
    assert len(set(pool.run(os.getpid))) == 2
