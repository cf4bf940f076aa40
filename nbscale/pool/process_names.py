"""The names a local pool's processes show in ps, top and pgrep (Linux's /proc/PID/comm, at most 15 bytes).

Forked processes keep their parent's command line, so a zygote, its forkservers and their workers all read
`python -m nbscale.pool.zygote` there: the name tells them apart.
"""

from __future__ import annotations

import ctypes

ZYGOTE = b"nbscale-zygote"
FORKSERVER = b"nbscale-forksrv"
WORKER = b"nbscale-worker"
_PR_SET_NAME = 15


def set_process_name(name: bytes) -> None:
    """Name this process (nothing happens where prctl is not there: not Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass
