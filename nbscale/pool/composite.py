"""Composite: a variable with one value per worker, fetched only when the notebook looks at it."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from nbscale.errors import PoolError


class CompositeIndexError(PoolError, IndexError):
    """A Composite has no value on that worker (an IndexError; notebooks show its message alone)."""


class CompositeTypeError(PoolError, TypeError):
    """A Composite was indexed or set the wrong way (a TypeError; notebooks show its message alone)."""


class CompositeSource(Protocol):
    """What a Composite needs of its pool (nbscale.Pool is one)."""

    closed: bool
    generation: str  # changes when the pool restarts: the old values are gone

    def pull(self, name: str, targets: Iterable[int] | None = None) -> list[Any]: ...

    def push(self, targets: Iterable[int] | None = None, **variables: object) -> None: ...


class Composite:
    """`x[r]` is worker r's value of the spmd variable `x` (`x[-1]` the last one's); `len(x)`; `x[:]` every value in
    rank order.

    Used in a later spmd cell, each worker simply uses its own value again: nothing is transferred.
    """

    def __init__(self, pool: CompositeSource, key: str, ranks: tuple[int, ...]) -> None:
        self._pool = pool
        self._generation = pool.generation
        self.key = key
        self.ranks = ranks

    def _live_pool(self) -> CompositeSource:
        pool = self._pool
        if pool.closed or pool.generation != self._generation:
            raise PoolError(
                f"Composite {self.key!r} belonged to workers that have since stopped or restarted; "
                "its values are gone. Run the %%spmd cell that makes it again."
            )
        return pool

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):  # the ranks' values in the slice's order, as a list slices: x[::-1] too
            ranks = self.ranks[index]
            if not ranks:
                return []
            by_rank = dict(zip(sorted(ranks), self._live_pool().pull(self.key, targets=sorted(ranks)), strict=True))
            return [by_rank[rank] for rank in ranks]
        index = self._rank_of(index)
        if index not in self.ranks:
            raise CompositeIndexError(
                f"Composite {self.key!r} has no value on worker {index}; it has ranks {list(self.ranks)}."
            )
        return self._live_pool().pull(self.key, targets=[index])[0]

    def __setitem__(self, index: int, value: object) -> None:
        if isinstance(index, slice):
            raise CompositeTypeError(
                f"Composite {self.key!r} is set one worker at a time: {self.key}[r] = value sets worker r's value "
                f"(to set it everywhere, pool.push({self.key}=value))."
            )
        index = self._rank_of(index)
        if index not in self.ranks:
            raise CompositeIndexError(f"Composite {self.key!r} has no worker {index}; it has ranks {list(self.ranks)}.")
        self._live_pool().push(targets=[index], **{self.key: value})

    def _rank_of(self, index: int) -> int:
        """A rank is its own index; a negative index counts from the end as in a list, so `x[-1]` is `x[:][-1]`."""
        try:
            index = operator.index(index)
        except TypeError:
            raise CompositeTypeError(
                f"Composite {self.key!r} is indexed by worker rank ({self.key}[0]) or a slice ({self.key}[:]), "
                f"not by {type(index).__name__}."
            ) from None
        if -len(self.ranks) <= index < 0:
            return self.ranks[index]
        return index

    def __iter__(self) -> Iterator[Any]:
        return iter(self[:])

    def __reduce__(self) -> Any:
        # pool.run, pool.push and %%spmd give each worker its own value; anywhere else a Composite is no one value
        raise TypeError(
            f"Composite {self.key!r} holds one value per worker, not one value to send: pass {self.key}[r] (worker "
            f"r's value) or {self.key}[:] (all of them), or give it to pool.run, pool.push or a %%spmd cell, where "
            "each worker uses its own value"
        )

    def belongs_to(self, pool: object) -> bool:
        return pool is self._pool and self._pool.generation == self._generation and not self._pool.closed

    def __repr__(self) -> str:
        if not self.belongs_to(self._pool):
            return (
                f"Composite {self.key!r} of workers that have since stopped or restarted: its values are gone "
                "(run the %%spmd cell that makes it again)"
            )
        return (
            f"Composite {self.key!r} on workers {list(self.ranks)} "
            f"({self.key}[r] fetches worker r's value; {self.key}[:] fetches all)"
        )
