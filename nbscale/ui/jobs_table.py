"""The `%jobs` table: plain text in a terminal, an HTML table in notebooks."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nbscale.ui.table import html_table, text_table

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
    """A snapshot of the job store: one row per job, from `nbscale.jobs.list_jobs()` or `nbscale.jobs.list()`."""

    store: str
    rows: list[dict[str, Any]]

    @classmethod
    def from_jobs(cls, jobs: Iterable[Mapping[str, Any] | Any], store: str) -> JobsTable:
        """The table of `jobs`: the dicts of list_jobs(), or Job objects (each read once, through as_dict())."""
        rows = []
        for job in jobs:
            fields = job if isinstance(job, Mapping) else job.as_dict()
            rows.append(
                {
                    "id": fields["id"],
                    "name": fields["name"] or "",
                    "state": fields["state"] + (f" ({fields['scheduler']})" if fields.get("scheduler") else ""),
                    "started": _started(fields["started"]),
                    "elapsed": format_elapsed(fields["elapsed_s"]),
                }
            )
        return cls(store, rows)

    @property
    def title(self) -> str:
        count = len(self.rows)
        return f"{count} job{'s' if count != 1 else ''} in {self.store}"

    def __repr__(self) -> str:
        if not self.rows:
            return f"No jobs in {self.store}. Submit one with %%batch."
        return text_table(self.title, COLUMNS, self.rows)

    def _repr_html_(self) -> str:
        if not self.rows:
            return (
                f"<div>No jobs in <code>{html.escape(self.store)}</code>. Submit one with <code>%%batch</code>.</div>"
            )
        table = html_table(COLUMNS, self.rows, _COLOURS)
        return f"<div><b>{html.escape(self.title)}</b>{table}</div>"
