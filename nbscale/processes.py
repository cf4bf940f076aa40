"""Whether a process still runs, by pid (pool registry, pool workers, batch jobs)."""

from __future__ import annotations

import os


def pid_running(pid: int) -> bool:
    """True while a process with this pid exists (one of another user's counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
