"""The kernel's view of one worker: who it is, its channel, and what it is doing."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def state(self) -> str:
        """"idle", "busy" or "dead"."""
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
