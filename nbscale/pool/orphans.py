"""No orphaned process: a pool process exits as soon as the process that started it is gone."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def exit_with_parent(thread_name: str, before_exit: Callable[[int], object] | None = None) -> None:
    """Exit this process (os._exit) once its parent is gone, watched from a daemon thread named `thread_name`;
    `before_exit(parent_pid)` runs first (the forkserver removes a killed kernel's files).

    Polls the parent pid instead of PR_SET_PDEATHSIG: for a process started from a thread, that fires when the
    thread ends, and a pool may be started from any thread of the kernel.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        if before_exit is not None:
            before_exit(parent)
        os._exit(1)

    threading.Thread(target=watch, name=thread_name, daemon=True).start()
