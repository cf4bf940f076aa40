"""A pool's settings (`nbscale.Pool(...)`, `%pool start ...`), checked in one place.

Every bad value is a PoolError naming the option (its Python name and its `%pool start` flag) and the fix, raised
before anything starts. `%pool restart` reuses the same settings.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nbscale.cluster_profiles import checked_connect_timeout
from nbscale.errors import PoolError

MAX_WORKERS = 512  # MATLAB's own ceiling for a local profile's NumWorkers
MAX_IDLE_TIMEOUT_MINUTES = 525_600  # a year; 0 means never


@dataclass(frozen=True)
class PoolSettings:
    """What a pool was asked for: `n` workers (None: the default size), `gpus` by index, `cpu` workers only,
    a `cluster` profile or address, `idle_timeout` in minutes (0: never), `env` for every worker, `force`:
    take GPUs another process holds too (nbscale.gpu_reservations), sharing them, and for a cluster pool
    `connect_timeout`, the seconds allowed to reach the cluster and start its actors (None: the profile's, or
    the default).

    Construction checks every field; the values are normalised (`gpus` a tuple, `idle_timeout` a float).
    """

    n: int | None = None
    gpus: tuple[int, ...] | None = None
    cpu: bool = False
    cluster: str | None = None
    idle_timeout: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # values are secrets: never printed
    force: bool = False
    connect_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_n(self.n)
        object.__setattr__(self, "gpus", _checked_gpus(self.gpus))
        if not isinstance(self.cpu, bool):
            raise PoolError(f"cpu (--cpu) must be True or False, not {self.cpu!r}.")
        if self.cpu and self.gpus:
            raise PoolError("--cpu and --gpus contradict each other: give one of them.")
        if self.cluster is not None and (not isinstance(self.cluster, str) or not self.cluster.strip()):
            raise PoolError(
                f"cluster (--cluster) must be a profile name or an address such as 'ray://head:10001', not "
                f"{self.cluster!r}."
            )
        if self.gpus is not None and self.cluster is not None:  # refused before connecting to the cluster
            raise PoolError(
                "--gpus picks GPUs of this machine; on a cluster pool Ray places the workers. Give N (and "
                "gpus_per_worker in the profile) instead."
            )
        if self.gpus is not None and self.n is not None and self.n != len(self.gpus):
            raise PoolError(
                f"--gpus lists {len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''} but N is {self.n}: "
                "one worker runs per listed GPU."
            )
        if not isinstance(self.force, bool):
            raise PoolError(f"force (--force) must be True or False, not {self.force!r}.")
        if self.force and (self.cpu or self.cluster is not None):
            without = "--cpu starts no GPU worker" if self.cpu else "a cluster pool takes the GPUs Ray gives it"
            raise PoolError(
                f"--force shares this machine's GPUs that another process holds; {without}, so leave --force out."
            )
        object.__setattr__(self, "idle_timeout", _checked_idle_timeout(self.idle_timeout))
        object.__setattr__(self, "env", _checked_env(self.env))
        object.__setattr__(self, "connect_timeout", checked_connect_timeout(self.connect_timeout, "connect_timeout"))
        if self.connect_timeout is not None and self.cluster is None:
            raise PoolError(
                "connect_timeout (--connect-timeout) is for cluster pools: it bounds reaching the cluster given with "
                "--cluster. A local pool has nothing to connect to; leave it out."
            )

    @property
    def idle_timeout_s(self) -> float | None:
        """The idle timeout in seconds, or None for never."""
        return self.idle_timeout * 60 if self.idle_timeout else None


def _check_n(n: object) -> None:
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise PoolError(f"N (the number of workers) must be a whole number such as 4, not {n!r}.")
    if int(n) < 1:  # int(): numbers.Integral declares no comparisons
        raise PoolError(f"A pool needs at least one worker, not {n!r}: use %pool start N with N >= 1.")
    if int(n) > MAX_WORKERS:
        raise PoolError(
            f"{n:,} workers is more than a pool can hold ({MAX_WORKERS}): ask for at most {MAX_WORKERS}, "
            "or train on a cluster pool of fewer, larger workers."
        )


def _checked_gpus(gpus: object) -> tuple[int, ...] | None:
    if gpus is None:
        return None
    if isinstance(gpus, str | bytes) or not isinstance(gpus, Iterable):
        raise PoolError(f"gpus must be a list of GPU indices such as [0, 2] (--gpus 0,2), not {gpus!r}.")
    indices = tuple(gpus)
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
            raise PoolError(f"gpus must list GPU indices (whole numbers >= 0, see %gpu) such as [0, 2], not {gpus!r}.")
    if not indices:
        raise PoolError("--gpus lists no GPU: give indices such as --gpus 0,2 (see %gpu), or --cpu for CPU workers.")
    repeated = sorted({index for index in indices if indices.count(index) > 1})
    if repeated:
        raise PoolError(
            f"--gpus lists GPU {', '.join(map(str, repeated))} twice: one worker runs per GPU, so list each once."
        )
    return tuple(int(index) for index in indices)


def _checked_idle_timeout(minutes: object) -> float:
    if isinstance(minutes, bool) or not isinstance(minutes, numbers.Real) or math.isnan(minutes):
        raise PoolError(
            f"idle_timeout (--idle-timeout) must be a number of minutes, such as 30 (0 = never), not {minutes!r}."
        )
    if not 0 <= float(minutes) <= MAX_IDLE_TIMEOUT_MINUTES:  # float(): numbers.Real declares no 0 <= x
        raise PoolError(
            f"idle_timeout (--idle-timeout) must be between 0 and {MAX_IDLE_TIMEOUT_MINUTES:,} minutes (a year), not "
            f"{minutes!r}: use 0 for a pool that never stops by itself."
        )
    return float(minutes)


def _checked_env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise PoolError(f"env must be a dict of KEY: VALUE strings (--env KEY=VALUE), not {type(env).__name__}.")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise PoolError(f"--env takes KEY=VALUE pairs with string values; {key!r} is not one.")
        if "\0" in key or "\0" in value:
            raise PoolError(
                f"--env {key.replace(chr(0), '?')}: the variable's name or value holds a NUL byte, which no "
                "environment variable can hold. Remove it."
            )
    return dict(env)
