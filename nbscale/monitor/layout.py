"""What a TrainingMonitor shows, checked when it is made: its metrics and info names, its groups of metrics, its
loggers, and the figure's panels they make."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nbscale.errors import OptionsError

REDUCES = ("first", "mean")
_PARAMETERS = {"metrics": ("self", "step"), "info": ("self",)}  # names record's or update_info's own parameters take


def checked_names(what: str, names: Any, required: bool = False) -> tuple[str, ...]:
    """`names` (metrics= or info=) as a tuple of distinct identifiers; OptionsError naming the fix otherwise."""
    if isinstance(names, str):
        names = [names]
    try:
        out = tuple(names)
    except TypeError:
        out = ()
    if (
        (required and not out)
        or not all(isinstance(n, str) and n.isidentifier() for n in out)
        or len(set(out)) < len(out)
    ):
        raise OptionsError(
            f"TrainingMonitor({what}={names!r}): give a list of distinct names usable as keywords, "
            f"such as {what}=['loss', 'val_loss']" + (" (at least one)." if required else ".")
        )
    taken = [n for n in out if n in _PARAMETERS[what]]
    if taken:
        call = "record(step, ...)" if what == "metrics" else "update_info(...)"
        raise OptionsError(
            f"TrainingMonitor({what}=[..., {taken[0]!r}, ...]): {taken[0]!r} is a parameter of monitor.{call}, so "
            f"it cannot be given as a keyword there; name it otherwise, such as {taken[0]!r} + '_value'."
        )
    return out


def checked_groups(groups: Mapping[str, Sequence[str]], metrics: tuple[str, ...]) -> dict[str, list[str]]:
    """`groups` (title -> metrics drawn in one panel), each metric in one group at most."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for title, members in groups.items():
        members = [members] if isinstance(members, str) else list(members)
        bad = [m for m in members if m not in metrics or m in seen]
        if bad or not members:
            raise OptionsError(
                f"TrainingMonitor(groups={{{title!r}: {members!r}}}): each group lists metrics of "
                f"metrics={list(metrics)}, each metric in one group at most."
            )
        seen.update(members)
        out[str(title)] = members
    return out


def checked_reduce(reduce: str) -> str:
    if reduce not in REDUCES:
        raise OptionsError(
            f"TrainingMonitor(reduce={reduce!r}): give 'first' (rank 0's values) or 'mean' (the "
            "mean over the ranks of a %%spmd cell)."
        )
    return reduce


def checked_loggers(loggers: Iterable[Any]) -> list[Any]:
    from nbscale.training.option_checks import _loggers

    problem = _loggers(loggers)
    if problem is not None:
        raise OptionsError(f"TrainingMonitor(loggers=...): give {problem}.")
    return list(loggers or ())


def panels_of(metrics: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[tuple[str, list[str]]]:
    """(title, metrics) per subplot: each group where its first metric comes, each other metric alone."""
    panels: list[tuple[str, list[str]]] = []
    placed: set[str] = set()
    for name in metrics:
        if name in placed:
            continue
        group = next(((title, members) for title, members in groups.items() if name in members), None)
        title, members = group if group is not None else (name, [name])
        panels.append((title, list(members)))
        placed.update(members)
    return panels
