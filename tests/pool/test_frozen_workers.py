"""Frozen workers in a real kernel: a SIGSTOPped worker, a cell deadlocked on a lock, a collective one rank never
joins, each during %%spmd or pool training. What the user sees, and how long it takes (the promises: a frozen
worker is named within 30 s, and the first interrupt returns within 10 s, on a quiet machine: the bounds scale
with the machine's load, tests/machine_load.py)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from tests.machine_load import scaled

pytestmark = pytest.mark.slow

DETECTION_LIMIT_S = 30.0
INTERRUPT_LIMIT_S = 10.0

# a cell whose workers meet in a collective every 10 ms: one frozen worker holds every other one up
COLLECTIVE_LOOP = "%%spmd\nimport time\nfor i in range(100000):\n    allreduce(torch.ones(1))\n    time.sleep(0.01)\n"

TRAINING_SETUP = """
import torch, nbscale
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, mini_batch_size=32, max_epochs=5000,
                                  execution_environment="parallel", plots="none", verbose=False)
"""
TRAINING = "net, info = nbscale.train(tiny_net(), (train_x, train_y), options)"


def _worker_pids(kernel) -> list[int]:
    shown = kernel.run("import nbscale\nprint(*[w.pid for w in nbscale.current_pool().workers])")
    return [int(pid) for pid in shown.stdout.split()]


def _timed(kernel, code: str, **options):
    started = time.monotonic()
    result = kernel.run(code, **options)
    return result, time.monotonic() - started


def _run_with_worker_1_stopped(kernel, code: str, after: float, **options):
    """On a fresh pool of 2 CPU workers, run `code` while worker 1 is SIGSTOPed `after` seconds into it: the cell,
    its seconds, and the workers' pids."""
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    threading.Timer(after, os.kill, (pids[1], signal.SIGSTOP)).start()
    cell, seconds = _timed(kernel, code, **options)
    return cell, seconds, pids


def test_a_stopped_worker_fails_its_cell_by_rank_within_30_s_and_restart_recovers(kernel):
    cell, seconds, pids = _run_with_worker_1_stopped(kernel, COLLECTIVE_LOOP, after=1.0, timeout=60)
    print(f"stopped worker named after {seconds - 1.0:.1f} s")
    assert seconds - 1.0 < DETECTION_LIMIT_S
    assert cell.error_name == "WorkerError"
    assert f"worker 1 (pid {pids[1]}) stopped answering" in cell.traceback
    assert "stopped (SIGSTOP" in cell.traceback and "%pool restart" in cell.traceback
    status = kernel.run("%pool status").displays[-1]["text/plain"]
    assert "dead" in status.splitlines()[3]  # the table's row of rank 1
    later = kernel.run("%%spmd\nprint(rank)")
    assert later.error_name == "WorkerError" and "stopped answering" in later.traceback
    assert kernel.run("%pool restart").stdout.startswith("Restarted 2 CPU workers")
    assert "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout


# alone: the 10 s is the feature (13.9 s beside the whole suite in CI on 2 cores, against a scaled 10)
@pytest.mark.alone
def test_one_interrupt_of_a_cell_with_a_stopped_worker_returns_within_10_s_with_a_fresh_pool(kernel):
    cell, seconds, pids = _run_with_worker_1_stopped(
        kernel, COLLECTIVE_LOOP, after=1.0, interrupt_after=3.0, timeout=60
    )
    print(f"interrupt returned after {seconds - 3.0:.1f} s")
    assert seconds - 3.0 < scaled(INTERRUPT_LIMIT_S)
    assert cell.error_name == "PoolInterrupted"
    assert "Worker 1 is a stopped process (SIGSTOP or a debugger), so the pool was restarted" in cell.traceback
    assert set(_worker_pids(kernel)).isdisjoint(pids)
    assert "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout


def test_a_cell_deadlocked_on_a_lock_is_named_and_one_interrupt_frees_it_keeping_the_pool(kernel):
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    kernel.run("%%spmd\nkept = rank * 10")
    deadlock = "%%spmd\nimport threading\nlock = threading.Lock()\nlock.acquire()\nif rank == 1:\n    lock.acquire()\n"
    cell, seconds = _timed(kernel, deadlock, interrupt_after=DETECTION_LIMIT_S - 2, timeout=90)
    print(f"interrupt returned after {seconds - (DETECTION_LIMIT_S - 2):.1f} s")
    # named before the interrupt came: the worker still answers the heartbeat, so the cell only says where it is
    assert "no progress for" in cell.stderr and "worker 1 at line 6 of the cell (`lock.acquire()`)" in cell.stderr
    assert "worker 0" not in cell.stderr
    assert seconds - (DETECTION_LIMIT_S - 2) < scaled(INTERRUPT_LIMIT_S)
    assert cell.error_name == "PoolInterrupted" and "The pool is ready for the next cell" in cell.traceback
    assert _worker_pids(kernel) == pids  # the same workers, with their variables
    assert "[1] 10" in kernel.run("%%spmd\nprint(kept)").stdout


def test_a_collective_one_worker_never_joins_is_interrupted_within_10_s_by_restarting_the_pool(kernel):
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    cell, seconds = _timed(
        kernel, "%%spmd\nif rank == 0:\n    allreduce(torch.ones(1))\n", interrupt_after=3.0, timeout=60
    )
    print(f"interrupt returned after {seconds - 3.0:.1f} s")
    assert seconds - 3.0 < scaled(INTERRUPT_LIMIT_S)
    assert cell.error_name == "PoolInterrupted"
    assert "Worker 0 did not stop within 3 s (stuck in a collective" in cell.traceback
    assert "the pool was restarted with fresh workers" in cell.traceback
    assert set(_worker_pids(kernel)).isdisjoint(pids)
    assert "[0] fine" in kernel.run("%%spmd\nprint('fine')").stdout


def test_ranks_in_different_collectives_are_named_within_the_heartbeat_window(kernel):
    """allreduce on rank 0, broadcast on rank 1: both wait forever (it hung with no word until interrupted)."""
    kernel.run("%pool start 2 --cpu")
    mismatch = "%%spmd\nif rank == 0:\n    allreduce(torch.ones(1))\nelse:\n    broadcast(torch.ones(1))\n"
    cell = kernel.run(mismatch, interrupt_after=8.0, timeout=60)  # named at the first heartbeat (every 3 s)
    assert (
        "Collective mismatch, the ranks wait for each other forever: rank 0 in allreduce (its collective 1 of "
        "this cell); rank 1 in broadcast (its collective 1 of this cell). Every rank must call the same "
        "collectives in the same order."
    ) in cell.stderr, cell.text
    assert cell.error_name == "PoolInterrupted" and "the pool was restarted" in cell.traceback
    matched = "%%spmd\nvalues = gather(rank) if rank == 0 else allgather(rank)\nprint(allreduce(rank))\n"
    cell = kernel.run(matched, timeout=60)  # gather meets allgather: no mismatch
    assert "[0] 1" in cell.stdout and "[1] 1" in cell.stdout and "mismatch" not in cell.stderr


def test_interrupts_during_the_automatic_restart_are_held_so_the_pool_is_never_lost(kernel):
    """A worker stuck in a collective: the first interrupt, then one that cuts the grace short and starts the
    restart, then a storm while it runs (each lost the pool: "Starting the pool was interrupted ... no pool is
    running", 3 of 3)."""
    # the restart's forkserver imports torch itself (no zygote: that forks one at once), so it takes long enough
    # for the storm below to land in it
    assert kernel.run("import os\nos.environ['NBSCALE_ZYGOTE'] = '0'").ok
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    # the second interrupt comes before the replacement is prepared (PREPARE_AFTER_S), so the restart starts
    # workers from nothing (1.3 s here; 0.7 s when prepared 0.2 s ahead): the last four come in its
    # first 0.45 s, never after the cell has ended (one then would land in the error's rendering)
    storm = [3.0, 3.2, 3.3, 3.4, 3.5, 3.65]
    cell = kernel.run("%%spmd\nif rank == 0:\n    allreduce(torch.ones(1))\n", interrupt_after=storm, timeout=60)
    assert cell.error_name == "PoolInterrupted", cell.text
    assert "the pool was restarted with fresh workers" in cell.traceback
    assert "during the restart" in cell.traceback and "held until it was done" in cell.traceback
    assert "interrupts are held until it is ready" in cell.stderr
    assert "no pool is running" not in cell.text
    assert set(_worker_pids(kernel)).isdisjoint(pids)
    assert "[1] fine" in kernel.run("%%spmd\nprint('fine')").stdout


# alone: the 10 s is the feature (15.8 s beside the whole suite on a slow 2-core VM, against a scaled 10)
@pytest.mark.alone
def test_one_interrupt_of_a_pool_training_with_a_stopped_worker_returns_within_10_s_and_says_why(kernel):
    assert kernel.run(TRAINING_SETUP).ok
    cell, seconds, pids = _run_with_worker_1_stopped(kernel, TRAINING, after=3.0, interrupt_after=5.0, timeout=60)
    print(f"interrupt returned after {seconds - 5.0:.1f} s")
    assert seconds - 5.0 < scaled(INTERRUPT_LIMIT_S)
    assert "Stopping at the end of this iteration. If the pool has not stopped in 3 s" in cell.stderr
    assert cell.error_name == "PoolInterrupted"
    assert "Training did not stop at the end of its iteration within 3 s of the interrupt" in cell.traceback
    assert "Worker 1 is a stopped process (SIGSTOP or a debugger), so the pool was restarted" in cell.traceback
    assert set(_worker_pids(kernel)).isdisjoint(pids)
    again = kernel.run(TRAINING.replace("options)", "options.replace(max_epochs=1))"))
    assert again.ok, again.text


def test_a_pool_training_with_a_stopped_worker_fails_naming_it_within_30_s(kernel):
    assert kernel.run(TRAINING_SETUP).ok
    cell, seconds, pids = _run_with_worker_1_stopped(kernel, TRAINING, after=3.0, timeout=90)
    print(f"stopped worker named after {seconds - 3.0:.1f} s")
    assert seconds - 3.0 < DETECTION_LIMIT_S
    assert cell.error_name == "WorkerError"
    assert "Training failed on worker 1" in cell.traceback
    # named first even where a busy machine delayed its peer's answers more (that peer waits for it in a collective)
    assert re.search(rf"worker 1 \(pid {pids[1]}\) stopped answering for \d+ s: its process is stopped", cell.traceback)


# alone: the 3 s the first interrupt gives a pool training to end its iteration is the feature; beside the whole
# suite on 2 cores one iteration and its report took longer (make test runs `alone` tests first, by themselves)
@pytest.mark.alone
def test_the_first_interrupt_of_a_healthy_pool_training_still_stops_it_at_the_end_of_an_iteration(kernel):
    assert kernel.run(TRAINING_SETUP).ok
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    cell, seconds = _timed(kernel, TRAINING, interrupt_after=4.0, timeout=60)
    assert cell.ok, cell.text
    assert seconds - 4.0 < 3.0  # it stopped by itself, before the grace ran out
    assert kernel.run("print(info.stop_reason)").stdout.strip() == "Stopped by kernel interrupt"
    assert _worker_pids(kernel) == pids


HANGING_LOSS = """
import torch.distributed as dist
from nbscale.pool.context import worker_context

class HangsOnRank1(torch.nn.CrossEntropyLoss):
    calls = 0
    def forward(self, outputs, labels):
        self.calls += 1
        if self.calls == 30 and worker_context().rank == 1:
            dist.all_reduce(torch.ones(1))  # a collective rank 0 never joins: both wait in gloo, deaf to interrupts
        return super().forward(outputs, labels)
"""


# alone: the 3 s the first interrupt gives a pool training to end its iteration is the feature; beside the whole
# suite on 2 cores one iteration and its report took longer (make test runs `alone` tests first, by themselves)
@pytest.mark.alone
def test_one_interrupt_of_a_pool_training_hung_in_a_collective_returns_within_10_s_with_a_fresh_pool(kernel):
    assert kernel.run(TRAINING_SETUP + HANGING_LOSS).ok
    kernel.run("%pool start 2 --cpu")
    pids = _worker_pids(kernel)
    cell, seconds = _timed(
        kernel, TRAINING.replace("options)", "options, loss_fn=HangsOnRank1())"), interrupt_after=6.0, timeout=60
    )
    print(f"interrupt returned after {seconds - 6.0:.1f} s")
    assert seconds - 6.0 < scaled(INTERRUPT_LIMIT_S)
    assert cell.error_name == "PoolInterrupted"
    assert "Training did not stop at the end of its iteration within 3 s" in cell.traceback
    assert "Workers 0, 1 did not stop within 3 s (stuck in a collective" in cell.traceback
    assert "the pool was restarted with fresh workers" in cell.traceback
    assert set(_worker_pids(kernel)).isdisjoint(pids)


def test_a_cell_that_keeps_meeting_in_collectives_and_sleeping_gets_no_stuck_note(kernel):
    kernel.run("%pool start 2 --cpu")
    # the same line (the sleep) every time the heartbeat looks, but the workers move on: that is progress
    cell = kernel.run(
        "%%spmd\nimport time\nend = time.time() + 26\n"
        "while allreduce(torch.tensor([float(time.time() < end)])).item() == world_size:\n    time.sleep(0.01)\n",
        timeout=90,
    )
    assert cell.ok, cell.text
    assert "no progress" not in cell.text


def test_a_cell_napping_at_one_line_gets_no_stuck_note(kernel):
    """The heartbeat sees the same instruction every time, but the thread wakes up a hundred times a second: moving.
    (A forked worker's threading.main_thread().native_id names the forking thread, so its wake-ups went unseen.)"""
    kernel.run("%pool start 2 --cpu")
    cell = kernel.run(
        "%%spmd\nimport time\nend = time.time() + 28\nwhile time.time() < end:\n    time.sleep(0.01)\n", timeout=90
    )
    assert cell.ok, cell.text
    assert "no progress" not in cell.text
