"""The local launcher: a process that has imported torch and forks every worker of one pool from itself.

Why a forkserver: `import torch` costs seconds, and paying it once instead of once per worker makes a pool
start about as fast as one `python -c "import torch"`. It is never a fork of the kernel, so whatever the notebook
did with CUDA cannot leak into workers: forking is safe because nothing here has touched CUDA. Each worker sets its
own CUDA_VISIBLE_DEVICES before any CUDA call.

Where it comes from (nbscale/pool/backends/forkserver_process.py): on Linux, forked from the kernel's zygote
(nbscale/pool/zygote.py), which imported torch once for every pool the kernel starts; elsewhere, or when no zygote
can be used, started as `python -m nbscale.pool.forkserver STATUS_FD`, which imports torch first and only then reads
its request (the kernel may start it early: LocalBackend.prepare, a restart's replacement prepared while the old
workers get their chance to stop).

Protocol: the kernel writes one JSON line on its stdin ({"workers": [worker configs]}) and keeps stdin open. When
stdin closes (pool stopped, or the kernel died), the forkserver kills every worker and exits; a kernel that closes
its pool writes `CLOSE` first, so the forkserver does not wait to see it gone (to remove its files) before exiting.
Workers also die with the forkserver (PR_SET_PDEATHSIG) and exit when their channel to the kernel closes.
When a worker ends, or the forkserver kills it, the processes its code started go with it (its process group).
Each worker that ends is reported on the pipe `STATUS_FD` as one JSON line {"pid": P, "status": S} (os.wait's
status), so the kernel can say how a worker died (killed by SIGKILL, exited with code 1) rather than guess.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import TextIO

from nbscale.pool import process_names
from nbscale.pool.orphans import exit_with_parent
from nbscale.pool.process_names import set_process_name
from nbscale.pool.protocol import WorkerConfig
from nbscale.pool.transport import remove_files_of_ended

_PR_SET_PDEATHSIG = 1
CLOSE = "close\n"  # the kernel's last line: it closed the pool (and is not gone)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the channel's EOF still ends the worker


def _fork_worker(config: WorkerConfig, status_fd: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:
        os.close(status_fd)  # the forkserver's report pipe is not the worker's
        os.setsid()  # our own process group: a terminal's Ctrl-C or a killpg of the kernel does not hit us
        set_process_name(process_names.WORKER)
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(config.env)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        from nbscale.pool.worker import serve

        serve(config)
    finally:
        os._exit(1)
    return 0  # unreachable


def _kill_group(pid: int) -> None:
    """SIGKILL worker `pid` and every process its code started (forked or spawned, in the worker's process group),
    which would otherwise outlive the pool. Called before the worker is reaped: until then its pid, and so its group
    id, cannot be taken by another process."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_all(children: set[int]) -> None:
    """SIGKILL every worker and what it started, and reap it, so none lingers even as a zombie."""
    for pid in list(children):
        _kill_group(pid)
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def main() -> None:
    """`python -m nbscale.pool.forkserver STATUS_FD`, started by the kernel itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # and so take every worker along: they die with us; a killed kernel's kept tensors go too (pool/mappings.py)
    exit_with_parent("nbscale-watch-kernel", remove_files_of_ended)
    import torch  # noqa: F401 - the expensive import, paid once for every worker (before the request: see prepare)

    import nbscale.pool.worker  # noqa: F401 - and the worker code with torch.distributed

    serve(sys.stdin, os.getppid(), int(sys.argv[1]))


def serve(requests: TextIO, kernel: int, status_fd: int) -> None:
    """Fork the workers `requests`' first line asks for, report each that ends on `status_fd`, and kill them all
    when `requests` closes (the pool was closed, or `kernel`, the process that holds its other end, is gone)."""
    line = requests.readline()
    if not line:  # the kernel let this forkserver go unused
        return
    request = json.loads(line)
    children = {_fork_worker(WorkerConfig.from_json(config), status_fd) for config in request["workers"]}

    def watch_kernel() -> None:
        closed = requests.read() == CLOSE  # returns at EOF: the pool was closed, or the kernel is gone
        _kill_all(children)
        if not closed:  # the kernel's kept tensors, once it is gone (it removes them itself when it closes a pool)
            remove_files_of_ended(kernel)
        os._exit(0)

    threading.Thread(target=watch_kernel, daemon=True).start()
    while children:
        try:  # WNOWAIT: the worker stays a zombie, its group id still its own, until its group is killed
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)  # never None: WNOHANG is not asked for
            assert ended is not None
            pid = ended.si_pid
            _kill_group(pid)
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            break
        children.discard(pid)
        _report(status_fd, pid, status)
    time.sleep(0.1)


def _report(status_fd: int, pid: int, status: int) -> None:
    """Tell the kernel how worker `pid` ended (it may have gone already: then nobody needs to know)."""
    try:
        os.write(status_fd, json.dumps({"pid": pid, "status": status}).encode() + b"\n")
    except OSError:
        pass


if __name__ == "__main__":
    main()
