"""Bookkeeping of requests in flight: who was asked, who answered, and how failures read."""

from __future__ import annotations

import functools
import itertools
import linecache
import queue
import re
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from nbscale.cell_names import cell_label
from nbscale.errors import WorkerError
from nbscale.pool import protocol as p
from nbscale.pool.output import OutputBacklog
from nbscale.pool.transport import Frame

_request_ids = itertools.count(1)


def next_request_id() -> int:
    return next(_request_ids)


@dataclass(frozen=True)
class WorkerDied:
    """Put in a request's inbox when a worker it waits for goes away."""

    rank: int
    description: str


@dataclass
class Request:
    """One request sent to some workers; blocking callers read `inbox`, futures are completed directly."""

    request_id: int
    ranks: tuple[int, ...]
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)
    replies: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    frame: Frame | None = None
    future: Future[Any] | None = None
    on_event: Callable[[int, Any], None] | None = None
    failure_classes: dict[int, type[Exception] | None] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # --env values: a worker's error may quote them, the notebook never shows them
    interrupting: set[int] = field(default_factory=set)  # ranks interrupted because another rank failed
    names_held: dict[int, tuple[str, ...]] = field(default_factory=dict)  # Failed.names, by rank
    backlog: OutputBacklog = field(default_factory=OutputBacklog)  # output in `inbox`, bounded

    @property
    def waiting_for(self) -> list[int]:
        return [rank for rank in self.ranks if rank not in self.replies and rank not in self.failures]

    def record(self, item: object) -> None:
        """Note a Done, Failed or WorkerDied."""
        if isinstance(item, p.Done):
            self.replies[item.rank] = item.value
        elif isinstance(item, p.Failed):
            self.names_held[item.rank] = item.names
            if item.rank in self.interrupting and item.error_type == "KeyboardInterrupt":
                self.replies[item.rank] = None  # stopped because another rank failed: that rank's error is the story
            else:
                failure = with_notebook_lines(item.traceback) or f"{item.error_type}: {item.message}"
                self.failures[item.rank] = without_secrets(failure, self.secrets)
                self.failure_classes[item.rank] = _exception_class(item.error_class)
        elif isinstance(item, WorkerDied):
            self.failures[item.rank] = item.description

    def error(self, what: str = "The cell", note: str = "") -> WorkerError:
        """One error listing each failing rank's traceback (and `note`, said after them).

        Where every failing rank raised the same exception class, the WorkerError is also an instance of that
        class, so `except ZeroDivisionError:` catches a worker's ZeroDivisionError as concurrent.futures does.
        """
        ranks = sorted(self.failures)
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        asked = f" (of {len(self.ranks)} workers)" if len(self.ranks) > 1 else ""
        parts = [f"{what} failed on {which}{asked}."]
        for rank in ranks:
            body = self.failures[rank].rstrip()
            parts.append(f"\n--- rank {rank} ---\n{body}")
        if note:
            parts.append(f"\n{note}")
        message, failures = "\n".join(parts), dict(self.failures)
        classes = {self.failure_classes.get(rank) for rank in ranks}
        original = classes.pop() if len(classes) == 1 else None
        if original is not None:
            try:
                # a class is hashable; mypy checks Exception's instance __hash__ against Hashable instead
                return _worker_error_class(original)(message, failures)  # type: ignore[arg-type]
            except Exception:  # an exception class whose constructor wants other arguments
                pass
        return WorkerError(message, failures)


def tells_of_a_torn_down_group(text: str) -> bool:
    """True for an error (or a worker's traceback) saying that a peer closed a process group's connections: read
    from a closed connection (reset, closed) or written to one (a broken pipe), by where the rank then was. Such a
    rank only stopped because another failed (and tore its group down): that one's error is the story."""
    return any(sign in text for sign in ("Connection reset by peer", "Connection closed by peer", "Broken pipe"))


SECRET_MIN_LENGTH = 6  # shorter --env values (1, INFO, eth0) are settings, and would blank out common words


def secrets_of(env: Mapping[str, str]) -> tuple[str, ...]:
    """The --env values a worker's error text must not show, longest first (so one inside another goes too)."""
    return tuple(sorted({value for value in env.values() if len(value) >= SECRET_MIN_LENGTH}, key=len, reverse=True))


def without_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with each secret replaced by ***."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


_FRAME_LINE = re.compile(r'  File "(?P<file>[^"]+)", line (?P<line>\d+), in .*')


def with_notebook_lines(text: str) -> str:
    """A worker's traceback with the source line added under each frame the worker could not read but the notebook
    can: functions defined in notebook cells (sent to the worker with pool.run, submit or map) live in files only
    the kernel's line cache holds."""
    lines = text.splitlines(keepends=True)
    shown: list[str] = []
    for index, line in enumerate(lines):
        frame = _FRAME_LINE.fullmatch(line.rstrip("\n"))
        cell = cell_label(frame["file"]) if frame is not None else None
        # as IPython names its cells ("Cell In[4], line 3, in scale"), not by the kernel's temporary file
        shown.append(line.replace(f'File "{frame["file"]}"', cell, 1) if frame is not None and cell else line)
        has_source = index + 1 < len(lines) and lines[index + 1].startswith("    ")
        if frame is not None and not has_source:
            source = linecache.getline(frame["file"], int(frame["line"])).strip()
            if source:
                shown.append(f"    {source}\n")
    return "".join(shown)


def _exception_class(where: tuple[str, str] | None) -> type[Exception] | None:
    """The notebook's own class for a worker's exception (builtins, the notebook's, imported modules'), or None."""
    if where is None:
        return None
    module, qualname = where
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, Exception) and not issubclass(found, WorkerError):
        return found
    return None


def worker_error_as(original: type[Exception], message: str, failures: dict[int, str]) -> WorkerError:
    """A WorkerError (`message`, `failures`) that is also an `original`, as a worker's own exception is raised."""
    return _worker_error_class(original)(message, failures)  # type: ignore[arg-type]  # classes are hashable


@functools.cache
def _worker_error_class(original: type[Exception]) -> type[WorkerError]:
    """A WorkerError that is also an `original` (shown and pickled as a plain WorkerError)."""
    try:
        return type(
            "WorkerError",
            (WorkerError, original),
            {
                "__module__": WorkerError.__module__,
                "__str__": BaseException.__str__,
                "__reduce__": lambda self: (WorkerError, (str(self), self.failures)),
            },
        )
    except TypeError:  # classes whose instance layouts cannot be combined
        return WorkerError
