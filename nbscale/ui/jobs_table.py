"""The `%jobs` table: plain text in a terminal, an HTML table in notebooks."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from typing import Any

COLUMNS = ("id", "name", "state", "started", "elapsed")
_COLOURS = {
    "queued": "#757575",
    "running": "#ef6c00",
    "finished": "#2e7d32",
    "failed": "#c62828",
    "cancelled": "#6d4c41",
}


def format_elapsed(seconds: float | None) -> str:
    """12.3 -> '12 s', 754 -> '12 min 34 s', 7384 -> '2 h 3 min'; None -> '-'."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _started(iso: str | None) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S") if iso else "-"


@dataclass
class JobsTable:
    """A snapshot of the job store: one row per job, from `nbscale.jobs.list_jobs()`."""

    store: str
    rows: list[dict[str, Any]]

    @classmethod
    def from_jobs(cls, jobs: list[dict[str, Any]], store: str) -> JobsTable:
        rows = [
            {
                "id": job["id"],
                "name": job["name"] or "",
                "state": job["state"],
                "started": _started(job["started"]),
                "elapsed": format_elapsed(job["elapsed_s"]),
            }
            for job in jobs
        ]
        return cls(store, rows)

    @property
    def title(self) -> str:
        count = len(self.rows)
        return f"{count} job{'s' if count != 1 else ''} in {self.store}"

    def __repr__(self) -> str:
        if not self.rows:
            return f"No jobs in {self.store}. Submit one with %%batch."
        cells = [[str(row[c]) for c in COLUMNS] for row in self.rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
        lines = [self.title, "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<div>No jobs in <code>{html.escape(self.store)}</code>. Submit one with <code>%%batch</code>.</div>"
        head = "".join(f"<th style='text-align:left'>{c}</th>" for c in COLUMNS)
        body = ""
        for row in self.rows:
            cells = ""
            for column in COLUMNS:
                value = html.escape(str(row[column]))
                if column == "state":
                    colour = _COLOURS.get(row["state"], "inherit")
                    value = f"<span style='color:{colour}'>&#9679; {value}</span>"
                cells += f"<td style='text-align:left'>{value}</td>"
            body += f"<tr>{cells}</tr>"
        return (
            f"<div><b>{html.escape(self.title)}</b><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>"
        )
