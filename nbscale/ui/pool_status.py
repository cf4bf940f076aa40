"""The `%pool status` table: plain text in a terminal, an HTML table in notebooks."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool

COLUMNS = ("rank", "host", "pid", "device", "state", "memory")


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
        cells = [[str(row[c]) for c in COLUMNS] for row in self.rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(COLUMNS)]
        lines = [self.title, "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colours = {"idle": "#2e7d32", "busy": "#ef6c00", "dead": "#c62828"}
        head = "".join(f"<th style='text-align:left'>{c}</th>" for c in COLUMNS)
        body = ""
        for row in self.rows:
            cells = ""
            for column in COLUMNS:
                value = html.escape(str(row[column]))
                if column == "state":
                    value = f"<span style='color:{colours.get(row['state'], 'inherit')}'>&#9679; {value}</span>"
                cells += f"<td style='text-align:left'>{value}</td>"
            body += f"<tr>{cells}</tr>"
        return f"<div><b>{html.escape(self.title)}</b><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
