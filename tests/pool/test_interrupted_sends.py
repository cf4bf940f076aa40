"""A kernel interrupt while a request is on its way to the workers: the request goes out whole to every rank, then
the interrupt lands (in a real kernel, with real workers)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

pytestmark = pytest.mark.slow

BLOB_BYTES = 64 * 2**20  # bytes, not a tensor: it travels in the message on the socket, not through /dev/shm


def test_interrupts_while_a_large_push_is_sent_leave_every_workers_channel_whole(kernel):
    kernel.run(
        f"%pool start 2 --cpu\nimport nbscale\npool = nbscale.current_pool()\nblob = bytes({BLOB_BYTES})\n"
        "pool.push(pushed=blob)"
    )
    # each push spends about half its time writing to the workers' sockets: over these points some interrupts land
    # part-way through a frame, others while pickling or waiting
    for seconds in (0.4, 0.7, 1.0, 1.3, 1.6, 1.9, 2.2, 2.5):
        interrupted = kernel.run("while True:\n    pool.push(pushed=blob)", interrupt_after=seconds, timeout=60)
        assert interrupted.error_name in ("PoolInterrupted", "KeyboardInterrupt"), interrupted.text
        cell = kernel.run("%%spmd\nprint(rank, len(pushed))", timeout=60)
        assert cell.ok, f"after an interrupt {seconds} s in: {cell.text}"
        assert f"[0] 0 {BLOB_BYTES}\n" in cell.stdout and f"[1] 1 {BLOB_BYTES}\n" in cell.stdout


def test_a_second_interrupt_frees_a_kernel_sending_to_a_worker_that_stopped_reading(kernel):
    kernel.run(f"%pool start 2 --cpu\nimport nbscale\npool = nbscale.current_pool()\nblob = bytes({BLOB_BYTES})")
    pid = int(kernel.run("print(pool.workers[1].pid)").stdout)
    os.kill(pid, signal.SIGSTOP)  # its socket's buffers fill, and the kernel's send waits for it to read
    try:
        threading.Timer(3.0, kernel.manager.interrupt_kernel).start()  # the second interrupt
        cell = kernel.run("pool.push(pushed=blob)", interrupt_after=2.0, timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert cell.error_name == "KeyboardInterrupt", cell.text
    later = kernel.run("%%spmd\nprint(rank)")
    assert later.error_name == "WorkerError", later.text
    assert "Worker 1 was cut off part-way through a message it was sent" in later.traceback
    assert "%pool restart" in later.traceback
    assert kernel.run("%pool restart").stdout.startswith("Restarted 2 CPU workers")
    assert "[1] 1" in kernel.run("%%spmd\nprint(rank)").stdout
