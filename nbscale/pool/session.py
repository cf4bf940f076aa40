"""The notebook's pool session: the running pool, and after a pool shut itself down idle, its settings and why.

One kernel runs at most one pool. `Pool` reports here when it starts and stops; `nbscale.pool.pool.open_pool`
reads this to reuse the running pool, or start the one that shut itself down idle again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nbscale.errors import PoolError
from nbscale.pool.settings import PoolSettings


class _Running(Protocol):
    """What the session needs of a pool (the pool module imports this one, not the other way)."""

    closed: bool

    @property
    def size(self) -> int: ...


@dataclass
class _Session:
    current: _Running | None = None
    idle_settings: PoolSettings | None = None  # the settings of the last pool, kept when it shut itself down idle
    shutdown_notice: str | None = None  # why the last pool stopped by itself, said once


_session = _Session()


def running() -> _Running | None:
    """The running pool, or None."""
    current = _session.current
    return current if current is not None and not current.closed else None


def refuse_second_pool() -> None:
    """Raise PoolError when a pool runs already (one kernel, one pool)."""
    current = running()
    if current is not None:
        raise PoolError(
            f"A pool of {current.size} worker{'s' if current.size != 1 else ''} is already running. Stop it first "
            "with %pool stop (pool.close()), or get fresh workers with %pool restart."
        )


def started(pool: _Running) -> None:
    """`pool` is the running pool now; a pool that shut itself down idle is no longer reopened."""
    _session.current = pool


def started_fully() -> None:
    """The running pool joined its group: the settings of the one that stopped idle are forgotten."""
    _session.idle_settings = None


def stopped(pool: _Running) -> None:
    """`pool` stopped (if it was the running one, none runs now)."""
    if _session.current is pool:
        _session.current = None


def stopped_idle(settings: PoolSettings, notice: str) -> None:
    """The running pool shuts itself down idle: keep its settings for one reopening, and `notice` to say once."""
    _session.shutdown_notice = notice
    _session.idle_settings = settings


def idle_settings() -> PoolSettings | None:
    """The settings of the pool that shut itself down idle, while no pool runs; else None."""
    return _session.idle_settings if running() is None else None


def take_shutdown_notice() -> str | None:
    """Why the last pool stopped by itself (its idle timeout), said once; None when it did not."""
    notice, _session.shutdown_notice = _session.shutdown_notice, None
    return notice


def reopens_idle_pool() -> bool:
    """True when `open_pool()` would start the pool that shut itself down idle again."""
    return idle_settings() is not None
