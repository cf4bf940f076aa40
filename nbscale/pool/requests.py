"""Bookkeeping of requests in flight: who was asked, who answered, and how failures read."""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from nbscale.errors import WorkerError
from nbscale.pool import protocol as p
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

    @property
    def waiting_for(self) -> list[int]:
        return [rank for rank in self.ranks if rank not in self.replies and rank not in self.failures]

    def record(self, item: Any) -> None:
        """Note a Done, Failed or WorkerDied."""
        if isinstance(item, p.Done):
            self.replies[item.rank] = item.value
        elif isinstance(item, p.Failed):
            self.failures[item.rank] = item.traceback or f"{item.error_type}: {item.message}"
        elif isinstance(item, WorkerDied):
            self.failures[item.rank] = item.description

    def error(self, what: str = "The cell") -> WorkerError:
        """One error listing each failing rank's traceback."""
        ranks = sorted(self.failures)
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts = [f"{what} failed on {which} (of {len(self.ranks)} workers)."]
        for rank in ranks:
            body = self.failures[rank].rstrip()
            parts.append(f"\n--- rank {rank} ---\n{body}")
        return WorkerError("\n".join(parts), dict(self.failures))
