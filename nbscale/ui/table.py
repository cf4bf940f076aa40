"""A small table shown as aligned text in a terminal and as HTML in notebooks (pool status, jobs)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def text_table(title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """The title, then the columns aligned with two spaces between them (a row without a column: an empty cell)."""
    cells = [[str(row.get(column, "")) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(r[i]) for r in cells)) if cells else len(column) for i, column in enumerate(columns)
    ]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def html_table(columns: Sequence[str], rows: Sequence[dict[str, Any]], state_colours: dict[str, str]) -> str:
    """An HTML table; the `state` column gets a coloured dot from `state_colours`; a row without a column: an empty
    cell."""
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
    body = ""
    for row in rows:
        cells = ""
        for column in columns:
            value = html.escape(str(row.get(column, "")))
            if column == "state":
                colour = state_colours.get(str(row["state"]).split(" ")[0], "inherit")  # "queued (SLURM ...)"
                value = f"<span style='color:{colour}'>&#9679; {value}</span>"
            cells += f"<td style='text-align:left'>{value}</td>"
        body += f"<tr>{cells}</tr>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
