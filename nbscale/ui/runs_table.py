"""How a table of training runs (a sweep's, `nbscale.show(run)`'s) shows: aligned text, or HTML with each run's
state as a coloured dot and each failed run's traceback folded below."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from nbscale.training.run_table import RunsTable, last_line
from nbscale.ui.table import html_table, text_table

if TYPE_CHECKING:
    from nbscale.training.sweep import SweepResult

_STATE_COLOURS = {
    "queued": "#888",
    "running": "#1f77b4",
    "done": "#2ca02c",
    "failed": "#d62728",
    "cancelled": "#ff7f0e",
}


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every row's columns, in the rows' order: a queued run's row has no metric cells, a training run's has them
    after "validation loss", so each column new to a row goes after the column before it there."""
    columns: list[str] = []
    for row in rows:
        position = -1
        for name in row:
            if name not in columns:
                columns.insert(position + 1, name)
            position = columns.index(name)
    columns = columns or ["run"]
    return [c for c in columns if c != "error" or any(r.get("error") for r in rows)]


def runs_table_text(table: RunsTable) -> str:
    """The table as aligned text, each failed run's traceback below it."""
    rows = table.rows()
    text = text_table(table.title, _columns(rows), rows)
    for run in table.runs:
        if run.state == "failed":
            text += f"\n\n{run.name} failed:\n{run.error}"
    return text


def runs_table_html(table: RunsTable) -> str:
    """The table as HTML, each failed run's traceback folded below it."""
    rows = table.rows()
    body = f"<b>{html.escape(table.title)}</b>" + html_table(_columns(rows), rows, _STATE_COLOURS)
    for run in table.runs:
        if run.state == "failed":
            body += (
                f"<details><summary>{html.escape(run.name)} failed: {html.escape(last_line(run.error))}"
                f"</summary><pre>{html.escape(run.error or '')}</pre></details>"
            )
    return body


def sweep_result_text(result: SweepResult) -> str:
    """A SweepResult shows as its results table."""
    return runs_table_text(result.table())


def sweep_result_html(result: SweepResult) -> str:
    """A SweepResult shows as its results table."""
    return runs_table_html(result.table())


def runs_table_bundle(table: RunsTable) -> dict[str, str]:
    """The table as a display bundle: HTML for notebooks, text for the rest."""
    return {"text/html": runs_table_html(table), "text/plain": runs_table_text(table)}
