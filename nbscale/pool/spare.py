"""A spare backend: the replacement a pool begins while interrupted workers get their chance to stop.

When workers do not stop at once after an interrupt, a restart may follow (waiting.py's `Restarter`); a local
pool's forkserver takes seconds to import torch, so it is begun meanwhile. The restart that follows takes it;
when the workers stopped after all, or the pool stops, it is stopped.
"""

from __future__ import annotations

from nbscale.pool.backends.base import Backend
from nbscale.pool.settings import PoolSettings
from nbscale.pool.startup import make_backend


class SpareBackend:
    """At most one prepared replacement backend for a pool with `settings`."""

    def __init__(self, settings: PoolSettings) -> None:
        self._settings = settings
        self._backend: Backend | None = None

    def prepare(self) -> None:
        """Begin starting a replacement (a local pool's forkserver imports torch), unless one is prepared."""
        if self._backend is not None:
            return
        try:
            backend = make_backend(self._settings)
        except Exception:  # only a head start: a restart that follows tries again and says why
            return
        self._backend = backend
        try:
            backend.prepare()
        except Exception:  # as above
            self.drop()

    def take(self) -> Backend | None:
        """The prepared replacement, now the caller's to start or stop (None when none was prepared)."""
        backend, self._backend = self._backend, None
        return backend

    def drop(self) -> None:
        """Stop the prepared replacement, if any."""
        if self._backend is not None:
            self._backend.stop()  # forgotten only once stopped: an interrupted stop is tried again (Pool._shut_down)
            self._backend = None
