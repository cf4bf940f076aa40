"""The `%pool status` table: plain text in a terminal, an HTML table in notebooks."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbscale.ui.table import html_table, text_table

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool

COLUMNS = ("rank", "host", "pid", "device", "state", "memory")
_STATE_COLOURS = {"idle": "#2e7d32", "busy": "#ef6c00", "dead": "#c62828"}


def _memory(megabytes: float | None) -> str:
    return "-" if megabytes is None else f"{megabytes:,.0f} MB"


@dataclass
class PoolStatus:
    """A snapshot of a pool's workers."""

    title: str
    rows: list[dict[str, Any]]

    @classmethod
    def from_pool(cls, pool: Pool) -> PoolStatus:
        state = pool.state()
        left = state["idle_timeout_left_s"]
        idle = f"; idle shutdown in {left / 60:.0f} min" if left is not None else ""
        title = f"Pool: {state['size']} {state['kind'].upper()} workers ({state['backend']}{idle})"
        rows = [
            {
                "rank": w["rank"],
                "host": w["host"],
                "pid": w["pid"],
                "device": w["device"],
                "state": w["state"],
                "memory": _memory(w["memory_mb"])
                + (f" (+{_memory(w['device_memory_mb'])} GPU)" if w.get("device_memory_mb") else ""),
            }
            for w in state["workers"]
        ]
        return cls(title, rows)

    def __repr__(self) -> str:
        return text_table(self.title, COLUMNS, self.rows)

    def _repr_html_(self) -> str:
        table = html_table(COLUMNS, self.rows, _STATE_COLOURS)
        return f"<div><b>{html.escape(self.title)}</b>{table}</div>"
