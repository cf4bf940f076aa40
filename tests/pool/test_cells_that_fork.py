"""A cell that forks or starts processes: the worker keeps answering, and nothing it started outlives the pool."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import nbscale
from nbscale.errors import WorkerError
from tests.kernel_session import KernelSession

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast

FORK_AND_WAIT = """%%spmd
import os
child = os.fork()
if child == 0:
    print('child of', rank)
    {child_end}
os.waitpid(child, 0)
print('parent', rank)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("child_end", "child_says"),
    [
        ("pass", ""),  # runs on to the end of the cell, as a script's child would
        ("import sys; sys.exit(0)", ""),
        ("raise ValueError('the child failed')", "ValueError: the child failed"),
    ],
)
def test_a_cell_whose_forked_child_runs_to_the_end_returns_and_the_pool_keeps_working(kernel, child_end, child_says):
    kernel.run("%pool start 2 --cpu")
    forked = kernel.run(FORK_AND_WAIT.format(child_end=child_end), timeout=60)
    assert forked.ok, forked.text
    for rank in (0, 1):
        assert f"[{rank}] child of {rank}" in forked.stdout
        assert f"[{rank}] parent {rank}" in forked.stdout  # the worker, not its child, answered the cell
        assert forked.stdout.count(f"parent {rank}") == 1  # and the child did not run the worker's last line
    assert child_says in forked.stderr
    after = kernel.run("%%spmd\nprint('still here', rank)", timeout=30)
    assert after.ok and "[0] still here 0" in after.stdout and "[1] still here 1" in after.stdout, after.text


@pytest.fixture
def pool():
    with nbscale.Pool(2, cpu=True) as running:
        yield running


def _start_children() -> list[int]:
    """A forked child and a spawned program, both left running by the cell."""
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    program = subprocess.Popen(["sleep", "600"])
    return [child, program.pid]


def test_processes_a_cell_started_end_when_the_pool_stops(pool):
    started = [pid for pids in pool.run(_start_children) for pid in pids]
    assert all(_alive(pid) for pid in started)
    pool.close()
    assert _gone_within(started, 5), [pid for pid in started if _alive(pid)]


def test_processes_a_killed_worker_started_end_with_it_and_restart_recovers(pool):
    started = pool.run(_start_children)
    os.kill(pool.workers[1].pid, signal.SIGKILL)
    assert _gone_within(started[1], 5), [pid for pid in started[1] if _alive(pid)]
    assert all(_alive(pid) for pid in started[0])  # the other worker's children are its own business
    with pytest.raises(WorkerError, match="killed by SIGKILL"):
        pool.run(os.getpid)
    pool.restart()
    assert _gone_within(started[0], 5)  # the restart ended worker 0 too, and what it started
    assert len(set(pool.run(os.getpid))) == 2


START_CHILDREN = """%%spmd
import os, subprocess, time
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
started = [child, subprocess.Popen(['sleep', '600']).pid]
"""


@pytest.mark.parametrize("end", ["shutdown", "kill"])
def test_processes_a_cell_started_end_when_the_kernel_shuts_down_or_dies(end):
    session = KernelSession()
    try:
        session.run("%load_ext nbscale\n%pool start 2 --cpu")
        assert session.run(START_CHILDREN, timeout=60).ok
        shown = session.run("print([pid for pids in started[:] for pid in pids])")
        started = [int(pid) for pid in shown.stdout.strip(" []\n").split(",")]
        assert len(started) == 4 and all(_alive(pid) for pid in started)
    finally:
        session.kill() if end == "kill" else session.shutdown()
    assert _gone_within(started, 5), [pid for pid in started if _alive(pid)]
