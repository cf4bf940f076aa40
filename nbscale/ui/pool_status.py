"""The `%pool status` table: plain text in a terminal, an HTML table in notebooks (renders a PoolStatus)."""

from __future__ import annotations

import html
from typing import Any

from nbscale.pool.status import PoolStatus
from nbscale.ui.table import html_table, text_table

COLUMNS = ("rank", "host", "pid", "device", "state", "memory")
_STATE_COLOURS = {"idle": "#2e7d32", "busy": "#ef6c00", "dead": "#c62828"}


def _memory(megabytes: float | None) -> str:
    return "-" if megabytes is None else f"{megabytes:,.0f} MB"


def _idle_left(seconds: float) -> str:
    # "0 min" read as "shutting down now" while up to half a minute was left.
    return "under a minute" if seconds < 60 else f"{seconds / 60:.0f} min"


def _title(status: PoolStatus) -> str:
    left = status.idle_timeout_left_s
    idle = f"; idle shutdown in {_idle_left(left)}" if left is not None else ""
    workers = f"{status.size} {status.kind.upper()} worker{'s' if status.size != 1 else ''}"
    return f"Pool: {workers} ({status.backend}{idle})"


def _rows(status: PoolStatus) -> list[dict[str, Any]]:
    return [
        {
            "rank": w.rank,
            "host": w.host,
            "pid": w.pid,
            "device": w.device,
            "state": w.state,
            "memory": _memory(w.memory_mb) + (f" (+{_memory(w.device_memory_mb)} GPU)" if w.device_memory_mb else ""),
        }
        for w in status.workers
    ]


def pool_status_text(status: PoolStatus) -> str:
    return text_table(_title(status), COLUMNS, _rows(status))


def pool_status_html(status: PoolStatus) -> str:
    table = html_table(COLUMNS, _rows(status), _STATE_COLOURS)
    return f"<div><b>{html.escape(_title(status))}</b>{table}</div>"
