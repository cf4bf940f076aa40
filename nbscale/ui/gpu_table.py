"""The `%gpu` table: plain text in a terminal, an HTML table with memory and utilization bars in notebooks; and
the line `%pool start` adds about the GPUs it took and those others hold."""

from __future__ import annotations

import html

from nbscale.gpu import GpuInfo, GpuList

COLUMNS = ("index", "name", "compute", "memory", "utilization", "temperature", "power", "holder", "processes")


def _cells(gpu: GpuInfo) -> dict[str, str]:
    if gpu.memory_used_mb is not None and gpu.memory_total_mb is not None:
        memory = f"{gpu.memory_used_mb:,.0f} / {gpu.memory_total_mb:,.0f} MiB"
    else:
        memory = "-"
    if gpu.power_w is not None:
        power = f"{gpu.power_w:.0f} W" + (f" / {gpu.power_limit_w:.0f} W" if gpu.power_limit_w else "")
    else:
        power = "-"
    processes = ", ".join(
        f"{p.name or 'pid'} {p.pid}" + (f" ({p.memory_used_mb:,.0f} MiB)" if p.memory_used_mb is not None else "")
        for p in gpu.processes
    )
    return {
        "index": f"{gpu.index}*" if gpu.selected else str(gpu.index),
        "name": gpu.name,
        "compute": gpu.compute_capability or "-",
        "memory": memory,
        "utilization": "-" if gpu.utilization_percent is None else f"{gpu.utilization_percent}%",
        "temperature": "-" if gpu.temperature_c is None else f"{gpu.temperature_c} C",
        "power": power,
        "holder": "; ".join(holder.describe() for holder in gpu.holders) or "free",
        "processes": processes or "none",
    }


def gpu_text(gpus: GpuList) -> str:
    """A fixed-width table, or the one-line reason there is no GPU."""
    if not gpus:
        return gpus.message or "No GPU."
    rows = [_cells(gpu) for gpu in gpus]
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in COLUMNS) for row in rows]
    if any(gpu.selected for gpu in gpus):
        lines.append("* the notebook's GPU (select_gpu)")
    return "\n".join(lines)


def _bar(fraction: float | None, colour: str) -> str:
    if fraction is None:
        return ""
    width = max(0.0, min(1.0, fraction)) * 100
    return (
        "<div style='width:8em;height:0.5em;background:#e0e0e0;border-radius:2px'>"
        f"<div style='width:{width:.0f}%;height:100%;background:{colour};border-radius:2px'></div></div>"
    )


def gpu_html(gpus: GpuList) -> str:
    """An HTML table with a bar under memory and utilization, or the one-line reason there is no GPU."""
    if not gpus:
        return f"<div class='nbscale-gpus'><b>{html.escape(gpus.message or 'No GPU.')}</b></div>"
    head = "".join(f"<th style='text-align:left'>{c}</th>" for c in COLUMNS)
    body = ""
    for gpu in gpus:
        cells = {c: html.escape(v) for c, v in _cells(gpu).items()}
        if gpu.memory_used_mb is not None and gpu.memory_total_mb:
            cells["memory"] += _bar(gpu.memory_used_mb / gpu.memory_total_mb, "#1976d2")
        if gpu.utilization_percent is not None:
            cells["utilization"] += _bar(gpu.utilization_percent / 100, "#ef6c00")
        body += "<tr>" + "".join(f"<td style='text-align:left'>{cells[c]}</td>" for c in COLUMNS) + "</tr>"
    note = "<div>* the notebook's GPU (select_gpu)</div>" if any(gpu.selected for gpu in gpus) else ""
    return f"<div class='nbscale-gpus'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}</div>"


def pool_gpus_note(gpus: GpuList) -> str:
    """ " on GPU 0, 2. Held by others: GPU 1 by bob's pool (notebook b.ipynb, pid 77)." for the GPUs this process's
    pool reserved and the holders of the others (or of the same ones, where --force shared them)."""
    taken = [str(gpu.index) for gpu in gpus if any(h.this_process and h.purpose == "pool" for h in gpu.holders)]
    held = [
        f"GPU {gpu.index} by {' and '.join(h.describe() for h in gpu.held_by_others())}"
        for gpu in gpus
        if gpu.held_by_others()
    ]
    note = f" on GPU {', '.join(taken)}." if taken else "."
    return note + (f" Held by others: {'; '.join(held)}." if held else "")
