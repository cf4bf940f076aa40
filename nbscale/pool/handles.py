"""The kernel's view of one worker: who it is, its channel, and what it is doing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nbscale.pool.channel import Channel


@dataclass
class WorkerHandle:
    """One worker as the kernel tracks it; `dead` says how it went away (None while it lives)."""

    rank: int
    pid: int
    host: str
    device: str
    channel: Channel
    outstanding: int = 0  # requests sent and not yet answered
    dead: str | None = None
    memory_mb: float | None = None
    device_memory_mb: float | None = None
    status_round: int = 0  # the last StatusQuery it answered
    folder_told: str | None = None  # the notebook folder it was last told to make importable (NotebookFolder)
    last_heard: float = field(default_factory=time.monotonic)  # when its last message arrived (monotonic s)
    transferring: bool = False  # a message to or from it is on its way now (a large one can take a while)
    where: str = ""  # where its main thread runs a request, as its last heartbeat said
    still_s: float = 0.0  # for how long that spot had not changed
    collective: str = ""  # the spmd collective it was in then ("allreduce#2"), as its last heartbeat said
    started: float | None = None  # its process's start time (psutil), once read: a reused pid is not it

    @property
    def state(self) -> str:
        """ "idle", "busy" or "dead"."""
        if self.dead:
            return "dead"
        return "busy" if self.outstanding else "idle"

    def send_quietly(self, message: object) -> None:
        """Send a control message; a worker that has gone is noticed by the receiver, not here."""
        if self.dead:
            return
        try:
            self.channel.send(message)
        except (OSError, ValueError):
            pass
