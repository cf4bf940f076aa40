"""%pool and %%spmd as a user runs them: in a real kernel, with real workers."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.kernel_session import KernelSession, cell_name
from tests.machine_load import scaled
from tests.pool_processes import forkservers_of

pytestmark = pytest.mark.slow


def _running(pids: list[int]) -> list[int]:
    """The pids still running (a zombie has exited: it only waits to be reaped)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[2])


def test_spmd_cell_reads_notebook_variables_and_returns_composites(kernel):
    assert kernel.run("%pool start 2 --cpu").stdout.startswith("Started 2 CPU workers")
    kernel.run("import torch\nweights = torch.ones(3) * 5")
    cell = kernel.run(
        "%%spmd\n"
        "w = broadcast(weights if rank == 0 else None)\n"
        "total = allreduce(w * (rank + 1))\n"
        "print(rank, world_size, device, total.tolist())\n"
    )
    assert cell.ok, cell.text
    assert "[0] 0 2 cpu [15.0, 15.0, 15.0]" in cell.stdout
    assert "[1] 1 2 cpu [15.0, 15.0, 15.0]" in cell.stdout
    shown = kernel.run("print(type(total).__name__, len(total), total[1].tolist())")
    assert shown.stdout.strip() == "Composite 2 [15.0, 15.0, 15.0]"
    again = kernel.run("%%spmd\nprint(total.sum().item())")
    assert "[0] 45.0" in again.stdout and "[1] 45.0" in again.stdout
    wrong = kernel.run("total[5]")  # a user's slip: the message alone, no frames of nbscale's Composite
    assert "Composite 'total' has no value on worker 5; it has ranks [0, 1]." in wrong.traceback
    assert "composite.py" not in wrong.traceback
    assert "composite.py" not in kernel.run("total['a']").traceback
    assert kernel.run("try:\n    total[5]\nexcept IndexError:\n    print('an IndexError')").stdout == "an IndexError\n"


def test_pool_status_is_an_html_table_in_notebooks(kernel):
    kernel.run("%pool start 2 --cpu")
    status = kernel.run("%pool status")
    html = status.displays[-1]["text/html"]
    assert "<table>" in html and "idle" in html
    assert "2 CPU workers" in status.displays[-1]["text/plain"]


def test_pool_status_shows_its_table_wherever_it_stands_in_the_cell(kernel):
    kernel.run("%pool start 2 --cpu")
    status = kernel.run("%pool\nafterwards = 1")
    assert status.ok and "2 CPU workers" in status.displays[-1]["text/plain"]


def test_failing_rank_shows_its_traceback_with_cell_lines_and_no_internals(kernel):
    kernel.run("%pool start 2 --cpu")
    cell = kernel.run("%%spmd\nx = 1\nif rank == 1:\n    x = undefined_name\n")
    assert cell.error_name == "WorkerError"
    assert "rank 1 (of 2 workers)" in cell.traceback
    # the notebook cell named as IPython names it (In[1] is the fixture's %load_ext), lines from the %%spmd line
    assert re.search("  " + cell_name(3) + r", line 4, in <module>\n    x = undefined_name\n", cell.traceback)
    assert "NameError: name 'undefined_name' is not defined" in cell.traceback
    assert "<spmd cell" not in cell.traceback and "ipykernel/" not in cell.traceback  # no frame of ipykernel's
    assert "site-packages" not in cell.traceback and "nbscale/pool" not in cell.traceback


def test_variables_a_failing_cell_assigned_before_its_error_stay_defined_where_workers_hold_them(kernel):
    kernel.run("%pool start 2 --cpu")
    cell = kernel.run(
        "%%spmd\nbefore = rank * 10\nif rank == 1:\n    raise ValueError('rank 1 gave up')\nafter = rank\n"
    )
    assert cell.error_name == "WorkerError" and "rank 1 gave up" in cell.traceback
    shown = kernel.run("print(len(before), before[:], len(after), after[0])")
    assert shown.stdout.strip() == "2 [0, 10] 1 0"  # `after` only on rank 0, which ran the whole cell
    assert "[1] 11" in kernel.run("%%spmd\nprint(before + 1)").stdout  # the workers' values, as the notebook shows


def test_bad_input_gets_one_clear_line(kernel):
    assert "unrecognized arguments: --bogus" in kernel.run("%pool start --bogus").text
    assert "at least one worker" in kernel.run("%pool start 0").traceback
    assert "does not exist" in kernel.run("%pool start --gpus 9").traceback
    assert "--gpus lists no GPU: give indices such as --gpus 0,2" in kernel.run("%pool start --gpus ,").traceback
    assert "between 0 and 525,600 minutes" in kernel.run("%pool start 1 --cpu --idle-timeout inf").traceback
    assert "must be a number of minutes" in kernel.run("%pool start 1 --cpu --idle-timeout nan").traceback
    assert "--idle-timeout x: give minutes as a number" in kernel.run("%pool start 1 --cpu --idle-timeout x").traceback
    assert "holds a NUL byte" in kernel.run('%pool start 1 --cpu --env "TOKEN=a\x00b"').traceback
    nameless = kernel.run("%pool start 1 --cpu --env =hunter2").traceback
    assert "a pair has no name before its '='" in nameless and "hunter2" not in nameless  # values are never shown
    assert "100,000 workers is more than a pool can hold" in kernel.run("%pool start 100000").traceback
    assert (
        "--connect-timeout soon: give seconds as a number" in kernel.run("%pool start --connect-timeout soon").traceback
    )
    assert "is for cluster pools" in kernel.run("%pool start 1 --cpu --connect-timeout 60").traceback
    assert "takes no N or flags" in kernel.run("%pool restart --connect-timeout 60").traceback
    assert "No pool is running" in kernel.run("%pool status").stdout  # none of the above started one
    assert "No closing quotation; close the quote" in kernel.run('%pool start 1 --cpu --env "GREETING=hello').text
    assert kernel.run('%pool start 1 --cpu --env "GREETING=hello world"').ok  # quotes group words, as in a shell
    assert "[0] hello world" in kernel.run("%%spmd\nimport os\nprint(os.environ['GREETING'])").stdout
    assert "already running" in kernel.run("%pool start 1 --cpu").traceback
    kernel.run("import threading\nlock = threading.Lock()")
    unpicklable = kernel.run("%%spmd\nprint(lock)")
    assert unpicklable.error_name == "UnsendableError" and "Variable 'lock'" in unpicklable.traceback
    magic = kernel.run("%%spmd\nx = 1\n%time y = 2\n").traceback
    assert "syntax error on line 3" in magic and "%magics and !commands do not run there" in magic


def test_spmd_targets_may_have_spaces_after_their_commas(kernel):
    kernel.run("%pool start 3 --cpu")
    cell = kernel.run("%%spmd --targets 1, 2\nprint('on', rank)")
    assert cell.ok, cell.text
    assert sorted(cell.stdout.splitlines()) == ["[1] on 1", "[2] on 2"]
    bad = kernel.run("%%spmd --targets 1, x\nprint(rank)")
    assert "'1,x' is not a comma-separated list of indices like 0,2." in bad.traceback


def test_interrupt_stops_workers_and_leaves_the_pool_usable(kernel):
    kernel.run("%pool start 2 --cpu")
    interrupted = kernel.run(
        "%%spmd\nimport time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n",
        interrupt_after=2.0,
        timeout=60,
    )
    assert interrupted.error_name == "PoolInterrupted"
    assert "[0] tick 0" in interrupted.stdout and "[1] tick 0" in interrupted.stdout
    assert "Interrupted workers 0, 1. The pool is ready" in interrupted.traceback
    after = kernel.run("%%spmd\nprint('still here', rank)")
    assert after.ok and "[1] still here 1" in after.stdout


def test_variables_an_interrupted_cell_assigned_stay_defined_where_workers_hold_them(kernel):
    kernel.run("%pool start 2 --cpu")
    interrupted = kernel.run(
        "%%spmd\nimport time\nbefore = rank * 10\nif rank == 1:\n    time.sleep(60)\nafter = rank\n",
        interrupt_after=2.0,
        timeout=60,
    )
    assert interrupted.error_name == "PoolInterrupted" and "Interrupted workers 1." in interrupted.traceback
    shown = kernel.run("print(len(before), before[:], len(after), after[0])")
    assert shown.stdout.strip() == "2 [0, 10] 1 0", shown.text  # `after` only on rank 0, which ran the whole cell
    assert "[1] 11" in kernel.run("%%spmd\nprint(before + 1)").stdout  # the workers' values, as the notebook shows


# a pool start is slow enough to interrupt where its forkserver imports torch: a zygote starting (its own runtime
# folder, where none runs yet), or a forkserver started without one (NBSCALE_ZYGOTE=0); a running zygote forks one
# in milliseconds
SLOW_STARTS = {
    "a zygote starting": "import os\nos.environ['NBSCALE_RUNTIME_DIR'] = {folder!r}",
    "no zygote": "import os\nos.environ['NBSCALE_ZYGOTE'] = '0'",
}


@pytest.mark.parametrize("slow_start", SLOW_STARTS)
def test_an_interrupt_while_the_pool_starts_is_one_line_and_leaves_no_process(kernel, slow_start, tmp_path):
    assert kernel.run(SLOW_STARTS[slow_start].format(folder=str(tmp_path))).ok
    interrupted = kernel.run("%pool start 2 --cpu", interrupt_after=0.5, timeout=60)
    assert interrupted.error_name == "PoolInterrupted", interrupted.text
    assert "Starting the pool was interrupted" in interrupted.traceback and "%pool start" in interrupted.traceback
    assert "channel.py" not in interrupted.traceback and "queue.py" not in interrupted.traceback  # no internals
    deadline = time.monotonic() + 5
    while forkservers_of(kernel.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert forkservers_of(kernel.pid) == []
    assert kernel.run("import nbscale\nprint(nbscale.current_pool())").stdout.strip() == "None"
    assert kernel.run("%pool start 2 --cpu").ok
    assert "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout


def test_an_interrupt_while_the_pool_stops_still_stops_it_and_leaves_no_process(kernel):
    kernel.run("%pool start 2 --cpu")
    [launcher] = forkservers_of(kernel.pid)
    os.kill(launcher, signal.SIGSTOP)  # a launcher slow to end keeps %pool stop waiting: the interrupt lands there
    try:
        stopped = kernel.run("%pool stop", interrupt_after=0.5, timeout=30)
    finally:
        if forkservers_of(kernel.pid):
            os.kill(launcher, signal.SIGCONT)
    assert stopped.error_name == "PoolInterrupted", stopped.text
    assert "it stopped all the same, and no worker is left" in stopped.traceback
    assert "subprocess.py" not in stopped.traceback
    deadline = time.monotonic() + 5
    while forkservers_of(kernel.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert forkservers_of(kernel.pid) == []
    assert kernel.run("import nbscale\nprint(nbscale.current_pool())").stdout.strip() == "None"
    assert kernel.run("%pool start 2 --cpu").ok and "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout


SLOW_TO_PICKLE = """import time
class SlowToPickle:
    def __reduce__(self):
        time.sleep(5)
        return (int, (1,))
slow = SlowToPickle()
"""


@pytest.mark.parametrize(
    "cell",
    [
        "%%spmd\nprint(slow)",
        "import nbscale\nnbscale.current_pool().run(print, slow)",
        "import nbscale\nnbscale.current_pool().submit(print, slow)",
    ],
)
def test_an_interrupt_while_a_cell_pickles_what_it_sends_is_one_line_and_the_pool_is_unchanged(kernel, cell):
    kernel.run("%pool start 2 --cpu")
    kernel.run("%%spmd\nkept = rank")
    kernel.run(SLOW_TO_PICKLE)
    interrupted = kernel.run(cell, interrupt_after=1.0, timeout=30)
    assert interrupted.error_name == "PoolInterrupted", interrupted.text
    assert "nothing was sent, and the pool is as it was" in interrupted.traceback
    assert "cloudpickle" not in interrupted.traceback and "SlowToPickle" not in interrupted.traceback
    after = kernel.run("%%spmd\nprint('kept', kept)", timeout=30)
    assert after.ok and "[1] kept 1" in after.stdout, after.text


def test_a_module_variable_the_workers_cannot_import_is_named_with_the_fix(kernel):
    kernel.run("%pool start 2 --cpu")
    kernel.run("import types\nhandmade = types.ModuleType('handmade')")
    failed = kernel.run("%%spmd\nprint(handmade)", timeout=30)
    assert failed.error_name == "WorkerError", failed.text
    assert (
        "Variable 'handmade' is the module 'handmade', which worker 0 cannot import (ModuleNotFoundError: "
        "No module named 'handmade')"
    ) in failed.traceback
    assert "add its folder to sys.path" in failed.traceback and "importlib" not in failed.traceback
    assert kernel.run("%%spmd\nprint('fine', rank)").ok


def test_killed_worker_is_reported_by_rank_and_restart_recovers(kernel):
    kernel.run("%pool start 2 --cpu")
    kernel.run("%%spmd\nbefore = rank")
    kernel.run("import nbscale, os, signal\nos.kill(nbscale.current_pool().workers[1].pid, signal.SIGKILL)")
    time.sleep(0.5)
    next_cell = kernel.run("%%spmd\nprint(rank)", timeout=30)
    assert next_cell.error_name == "WorkerError"
    assert "worker 1" in next_cell.traceback.lower() and "%pool restart" in next_cell.traceback
    assert kernel.run("%pool restart").stdout.startswith("Restarted 2 CPU workers")
    assert "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout
    stale = kernel.run("before")
    assert "Composite 'before' of workers that have since stopped or restarted" in stale.text
    assert "Run the %%spmd cell that makes it again" in kernel.run("before[0]").traceback


def test_a_progress_line_redrawn_with_carriage_returns_stays_one_line_per_rank(kernel):
    kernel.run("%pool start 1 --cpu")
    cell = kernel.run(
        "%%spmd\n"
        "import sys\n"
        "for step in range(3):\n"
        "    sys.stderr.write(f'\\rstep {step}/3'); sys.stderr.flush()\n"
        "sys.stderr.write('\\rdone\\n')\n"
    )
    assert cell.ok, cell.text
    assert cell.stderr == "\r[0] step 0/3\r[0] step 1/3\r[0] step 2/3\r[0] done\n"  # the notebook redraws in place
    ended_by_print = kernel.run(
        "%%spmd\nfor step in range(3):\n    print(f'\\rstep {step}', end='', flush=True)\nprint()\nprint('after')\n"
    )
    assert ended_by_print.stdout == "\r[0] step 0\r[0] step 1\r[0] step 2\n[0] after\n"  # no empty "[0] " line


def test_progress_lines_of_several_ranks_make_one_line_each_not_one_per_redraw(kernel):
    kernel.run("%pool start 3 --cpu")
    cell = kernel.run(
        "%%spmd\n"
        "import sys, time\n"
        "for step in range(20):\n"
        "    sys.stderr.write(f'\\rstep {step + 1}/20'); sys.stderr.flush(); time.sleep(0.01)\n"
        "barrier(); time.sleep(0.5)\n"  # every bar's last redraw is shown before any bar ends
        "sys.stderr.write('\\n')\n"
        "print('after', rank)\n"
    )
    assert cell.ok, cell.text
    lines = cell.stderr.split("\n")
    assert len(lines) == 4 and lines[-1] == "", lines  # one line per rank (a stream redraws only its last line)
    assert sorted(line.rsplit("\r", 1)[-1] for line in lines[:-1]) == [f"[{r}] step 20/20" for r in range(3)]
    assert sorted(cell.stdout.splitlines()) == ["[0] after 0", "[1] after 1", "[2] after 2"]


def test_a_line_printed_in_pieces_stays_one_line_with_one_rank_prefix(kernel):
    kernel.run("%pool start 1 --cpu")
    cell = kernel.run(
        "%%spmd\nimport time\nprint('loading...', end='', flush=True)\ntime.sleep(0.3)\nprint(' done')\n"
        "print('no newline at the end', end='')\n"
    )
    assert cell.ok, cell.text
    assert cell.stdout == "[0] loading... done\n[0] no newline at the end\n"
    assert kernel.run("%%spmd\nprint('next cell')").stdout == "[0] next cell\n"  # on a line of its own, prefixed


def test_a_line_every_rank_prints_in_pieces_stays_one_line_per_rank(kernel):
    kernel.run("%pool start 2 --cpu")
    cell = kernel.run("%%spmd\nimport time\nprint('loading', end='', flush=True)\ntime.sleep(0.3)\nprint(' ok')\n")
    assert cell.ok, cell.text
    assert sorted(cell.stdout.splitlines()) == ["[0] loading ok", "[1] loading ok"]


def test_spmd_without_a_pool_starts_one_and_says_so(kernel):
    cell = kernel.run("%%spmd\nprint('hi')")
    assert cell.ok and "starting one with %pool start defaults" in cell.stdout
    assert "[0] hi" in cell.stdout


def test_spmd_after_an_idle_shutdown_starts_the_same_pool_again_and_says_so(kernel):
    kernel.run("%pool start 1 --cpu --idle-timeout 0.02")  # 1.2 s
    kernel.run("import nbscale, time\nwhile nbscale.current_pool() is not None:\n    time.sleep(0.1)", timeout=30)
    cell = kernel.run("%%spmd\nprint('workers', world_size)")
    assert cell.ok, cell.text
    assert (
        "The pool shut itself down after 0.02 idle minutes (--idle-timeout). Starting it again with the same settings."
    ) in cell.stdout
    assert "[0] workers 1" in cell.stdout  # one worker as asked, not the default size
    kernel.run("while nbscale.current_pool() is not None:\n    time.sleep(0.1)", timeout=30)
    restarted = kernel.run("%pool restart")  # what a user types to get the pool back
    assert restarted.ok, restarted.text
    assert restarted.stdout.startswith(
        "The pool shut itself down after 0.02 idle minutes (--idle-timeout). Starting it "
        "again with the same settings.\nRestarted 1 CPU worker in"
    )


def test_every_worker_exits_when_the_kernel_dies():
    session = KernelSession()
    session.run("%load_ext nbscale\nimport nbscale")
    session.run("%pool start 2 --cpu")
    shown = session.run("p = nbscale.current_pool()\nprint(*[w.pid for w in p.workers])")
    workers = [int(pid) for pid in shown.stdout.split()]
    pids = [*workers, _parent(workers[0])]  # and the forkserver they were forked from
    assert len(_running(pids)) == 3
    session.kill()
    deadline = time.monotonic() + 10
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(pids) == []


# alone: how fast the output arrives is the feature; the load of the suite beside it varies faster than the scaling
# measures it (11.8 s against a scaled bound of 10.8 s in CI)
@pytest.mark.alone
def test_large_output_arrives_whole_in_order_and_quickly(kernel):
    kernel.run("%pool start 2 --cpu")
    started = time.monotonic()
    cell = kernel.run("%%spmd\nfor i in range(20000):\n    print(i)\n", timeout=120)
    elapsed = time.monotonic() - started
    assert cell.ok, cell.text[-2000:]
    for rank in (0, 1):
        lines = [line for line in cell.stdout.splitlines() if line.startswith(f"[{rank}] ")]
        assert lines == [f"[{rank}] {i}" for i in range(20000)]
    # one flush per line (40,000 messages) took 13 s on a quiet machine; batched, 8 s there and 11.5 s on a slower
    # 2-core VM, so the time is bounded loosely (scaled with the load: tests/machine_load.py) and the batching by count
    assert cell.stdout_messages < 4000, f"{cell.stdout_messages} messages for 40,000 lines"
    assert elapsed < scaled(20), f"40,000 lines took {elapsed:.1f} s"


def test_interrupting_pool_map_cancels_its_items_and_says_so(kernel):
    kernel.run("%pool start 2 --cpu\nimport nbscale, time\npool = nbscale.current_pool()")
    cell = kernel.run("results = list(pool.map(time.sleep, [30] * 5))", interrupt_after=2.0, timeout=60)
    assert cell.error_name == "PoolInterrupted", cell.text
    # submitted two per worker ahead: the fifth item was never sent
    assert (
        "Interrupted pool.map: 2 running calls interrupted on the workers and 2 queued ones cancelled. "
        "The pool is ready for the next cell."
    ) in cell.traceback
    assert "site-packages" not in cell.traceback and "nbscale/pool" not in cell.traceback
    after = kernel.run("print(list(pool.map(abs, [-1, -2, -3])))", timeout=30)
    assert after.stdout.strip() == "[1, 2, 3]"


def test_interrupting_a_long_map_leaves_nothing_running_and_an_endless_one_holds_the_kernels_memory(kernel):
    """A 100,000-item map spent ~25 s submitting, where an interrupt cancelled nothing and the next task waited for
    every item; over an endless iterable the kernel grew ~55 MB/s. Items now go a few per worker ahead."""
    kernel.run("%pool start 2 --cpu\nimport itertools, os, time, psutil, nbscale\npool = nbscale.current_pool()")
    cell = kernel.run("results = list(pool.map(time.sleep, [0.01] * 100000))", interrupt_after=3.0, timeout=60)
    assert cell.error_name == "PoolInterrupted", cell.text
    waited = kernel.run(
        "started = time.monotonic()\npool.submit(os.getpid).result(timeout=60)\n"
        "print(f'{time.monotonic() - started:.1f}')"
    )
    assert float(waited.stdout) < 5, waited.text  # nothing of the map's left to run first
    kernel.run("before = psutil.Process().memory_info().rss")
    cell = kernel.run("for _ in pool.map(abs, itertools.count()):\n    pass", interrupt_after=8.0, timeout=60)
    assert cell.error_name == "PoolInterrupted", cell.text
    grown = kernel.run("print((psutil.Process().memory_info().rss - before) / 2**20)")
    print(f"kernel grew {float(grown.stdout):.1f} MB over an 8 s endless map")
    assert float(grown.stdout) < 50
    assert kernel.run("print(list(pool.map(abs, [-1, -2, -3])))", timeout=30).stdout.strip() == "[1, 2, 3]"


def test_a_task_traceback_shows_the_lines_of_functions_defined_in_the_notebook(kernel):
    kernel.run("%pool start 1 --cpu\nimport nbscale\npool = nbscale.current_pool()")
    kernel.run("def scale(value):\n    factor = 10\n    return value * factor / (value - 2)\n")
    cell = kernel.run("list(pool.map(scale, [1, 2, 3]))")
    assert cell.error_name == "WorkerError"
    assert "scale() of pool.map's item 1 failed on rank 0" in cell.traceback
    scale_line = r", line 3, in scale\n    return value \* factor / \(value - 2\)\nZeroDivisionError"
    assert re.search("  " + cell_name(3) + scale_line, cell.traceback), cell.traceback
