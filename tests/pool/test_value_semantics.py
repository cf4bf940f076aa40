"""A pool's arguments keep their value semantics (issue 43, items 1-3 and 6): a task sees its arguments as they were
at submit, a call never sees another call's writes, and shared memory goes with the tensors that held it.

The pool's shared-memory folder is a private folder of the test (NBSCALE_SHM_DIR, tests/pool/conftest.py's `shm`),
so its files can be counted.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy
import pytest
import torch

import nbscale
from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE, deserialise, serialise

pytestmark = pytest.mark.slow

MIB = 2**20
WAIT_S = 60


def _sum_then_write_through_numpy(tensor):
    total = float(tensor.double().sum())
    values = tensor.numpy()  # a NumPy view: torch's version counter does not move
    values -= values.mean() - 7
    return total


def _sum_then_write_through_data(tensor):
    total = float(tensor.double().sum())
    tensor.data.fill_(7)  # .data: a version counter of its own
    return total


@pytest.mark.parametrize("write", [_sum_then_write_through_numpy, _sum_then_write_through_data])
def test_a_workers_write_that_torch_does_not_count_never_reaches_its_next_call(shm, write):
    data = torch.zeros(4 * MIB)  # 16 MiB: kept in shared memory between calls
    with nbscale.Pool(1, cpu=True) as pool:
        assert [pool.run(write, data) for _ in range(3)] == [[0.0]] * 3
        pool.push(pushed=data)
        assert pool.run(write, data) == [0.0]  # written where `pushed` may share the worker's memory ...
        assert [float(value.sum()) for value in pool.pull("pushed")] == [0.0]  # ... and `pushed` kept its values
    assert float(data.sum()) == 0.0


def _first_value_once_released(tensor, release):
    deadline = time.monotonic() + 60
    while not os.path.exists(release):  # the worker stays busy until the test has queued every task
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return float(tensor.reshape(-1)[0])


@pytest.mark.parametrize("elements", [1024, 1024 * 1024, 4 * MIB])  # 4 KiB inline, 4 MiB out of band, 16 MiB kept
def test_a_queued_task_runs_on_its_arguments_as_they_were_at_submit(shm, tmp_path, elements):
    buffer, release = torch.zeros(elements), str(tmp_path / "release")
    array = numpy.zeros(elements, dtype=numpy.float32)
    with nbscale.Pool(1, cpu=True) as pool:
        busy = pool.submit(_first_value_once_released, torch.zeros(1), release)
        tensors, arrays = [], []
        for value in range(3):
            buffer[:] = value  # in place, after the submit of the previous value
            array[:] = value
            tensors.append(pool.submit(_first_value_once_released, buffer, release))
            arrays.append(pool.submit(_first_value_once_released, array, release))
        Path(release).touch()
        assert busy.result(WAIT_S) == 0.0
        assert [future.result(WAIT_S) for future in tensors] == [0.0, 1.0, 2.0]
        assert [future.result(WAIT_S) for future in arrays] == [0.0, 1.0, 2.0]


def test_a_frame_for_another_machine_holds_its_own_copy_once_told_to():
    values = torch.zeros(MIB)
    frame = serialise(values, keep=False)
    frame.hold_values(local=False)
    values += 1
    received = deserialise(frame.body, [torch.frombuffer(buffer, dtype=torch.uint8) for buffer in frame.buffers])
    assert float(received.sum()) == 0.0


def _mapped_files():
    with open("/proc/self/maps") as maps:
        return sorted(
            {
                line.split()[-2] if line.endswith("(deleted)\n") else line.split()[-1]
                for line in maps
                if "nbscale-" in line
            }
        )


def test_a_dropped_tensors_memory_is_released_at_the_workers_next_message_whatever_it_is(shm):
    data = torch.ones(4 * MIB)
    with nbscale.Pool(2, cpu=True) as pool:
        assert pool.run(torch.sum, data) == [float(4 * MIB)] * 2
        assert [len(files) for files in pool.run(_mapped_files)] == [1, 1]
        del data
        gc.collect()
        assert list(shm.iterdir()) == []
        assert pool.run(_mapped_files) == [[], []]  # a message that sends no kept file


def test_a_killed_kernels_kept_files_go_when_its_workers_see_it_die(shm):
    script = textwrap.dedent("""
        import os, signal, torch, nbscale
        pool = nbscale.Pool(2, cpu=True)
        data = torch.ones(4 * 2**20)
        pool.run(torch.sum, data)
        print("kept", len(os.listdir(os.environ["NBSCALE_SHM_DIR"])), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    killed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, SHARED_MEMORY_DIR_VARIABLE: str(shm)},
    )
    assert "kept 1" in killed.stdout and killed.returncode == -signal.SIGKILL, killed.stderr
    deadline = time.monotonic() + WAIT_S
    while list(shm.iterdir()):  # the workers notice the closed connection, then remove it
        assert time.monotonic() < deadline, list(shm.iterdir())
        time.sleep(0.05)


def _stale_file(folder: Path, size: int) -> Path:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = folder / f"nbscale-{int(ended.stdout)}-0123456789abcdef"
    path.write_bytes(b"\0" * size)
    return path


def test_nbscale_doctor_reports_stale_shared_memory_files_and_removes_them_when_asked(shm):
    stale = _stale_file(shm, MIB)
    command = [sys.executable, "-m", "nbscale", "doctor"]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    found = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    line = next(line for line in found.stdout.splitlines() if "stale shm files" in line)
    assert line.startswith("NOTE") and f"1 file (1.0 MiB) left in {shm}" in line, found.stdout
    assert "nbscale doctor --remove-stale" in line and stale.exists()
    removed = subprocess.run([*command, "--remove-stale"], capture_output=True, text=True, env=environment, timeout=120)
    assert removed.stdout.startswith("Removed 1 stale shared-memory file (1.0 MiB)."), removed.stdout
    assert not stale.exists()
    assert "OK       stale shm files   no file left" in removed.stdout, removed.stdout


def test_files_left_by_a_killed_process_are_removed_at_the_next_pool_start(shm):
    stale = _stale_file(shm, 4096)
    with nbscale.Pool(1, cpu=True):
        assert not stale.exists()
