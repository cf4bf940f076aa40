"""The kernel <-> worker protocol: a handful of small frozen dataclasses.

Every message travels over an authenticated `Channel` (see channel.py); nothing is unpickled before the peer
proved it holds the pool's secret. `request_id` ties replies (Output, Event, Done, Failed) to the request.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# ---- the worker's start-up configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker needs to start: where the kernel listens, the pool's secret, its rank, device and env.

    Travels as one JSON line on a pipe to the forkserver or the Ray launcher, never on a command line: it holds
    the secret and the --env values. `threads` caps torch's CPU threads (None: torch's default).
    """

    kernel_address: tuple[str, int]
    secret: str  # hex
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:0" (each GPU worker sees only its own GPU)
    kernel_machine_id: str
    env: dict[str, str] = field(default_factory=dict)
    threads: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerConfig:
        return cls(**{**data, "kernel_address": tuple(data["kernel_address"])})

    def encode(self) -> bytes:
        """One JSON line (what `python -m nbscale.pool.worker` reads on stdin)."""
        return json.dumps(self.to_json()).encode() + b"\n"


# ---- kernel -> worker ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitGroup:
    """Join the torch.distributed group through its rendezvous store.

    `store_file` set (every worker on the kernel's machine): the store is that file, in a 0700 folder of the
    user's, so no other user can read or write it (torch's TCPStore has no authentication). Otherwise (a cluster)
    rank 0 (master_port 0) opens a TCPStore on `master_addr` only and reports its port (as an Event
    `{"store_port": port}`).
    """

    request_id: int
    backend: str
    master_addr: str
    master_port: int
    world_size: int
    store_file: str | None = None


@dataclass(frozen=True)
class MakeGroup:
    """Create a subgroup over `ranks` (every worker must take part, as torch.distributed requires)."""

    request_id: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RunCell:
    """Run an spmd cell: bind `variables`, exec `code`, report which of `result_names` now exist.

    `cwd` is the notebook's current folder when the cell was sent: the worker runs the cell there (see FolderMissing).
    """

    request_id: int
    code: str
    filename: str
    variables: dict[str, Any]
    result_names: tuple[str, ...]
    group_ranks: tuple[int, ...] | None = None
    cwd: str | None = None


@dataclass(frozen=True)
class Call:
    """Call `function(*args, **kwargs)` in the folder `cwd` (the notebook's when sent) and reply with its return
    value."""

    request_id: int
    function: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class Push:
    """Bind `variables` in the worker's namespace."""

    request_id: int
    variables: dict[str, Any]


@dataclass(frozen=True)
class Pull:
    """Reply with the values of `names` from the worker's namespace."""

    request_id: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Interrupt:
    """Raise KeyboardInterrupt in the worker's main thread (handled by its receiver thread).

    With `request_id` (pool.cancel), only that request: interrupted if it runs, never started if still queued.
    """

    request_id: int | None = None


@dataclass(frozen=True)
class NotebookFolder:
    """The notebook's current folder changed: make it importable on the worker (before the request that follows,
    whose pickles may name modules there, is read)."""

    folder: str


@dataclass(frozen=True)
class RequestStop:
    """Set the worker's stop flag, which training loops poll (the Stop button)."""


@dataclass(frozen=True)
class RequestMessage:
    """A small value for the code running request `request_id` on a worker, which reads it with
    `worker_context().next_message()`; dropped where that request no longer runs."""

    request_id: int
    payload: Any


@dataclass(frozen=True)
class StatusQuery:
    """Ask for the worker's memory use; answered by the receiver thread even while the worker is busy."""

    request_id: int


@dataclass(frozen=True)
class Shutdown:
    """Exit now."""


# ---- worker -> kernel ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The first message of a worker after authentication."""

    rank: int
    pid: int
    host: str
    device: str
    machine_id: str


@dataclass(frozen=True)
class Output:
    """Text the worker printed (whole lines where possible)."""

    rank: int
    stream: str
    text: str


@dataclass(frozen=True)
class FolderMissing:
    """The worker could not change to a request's `cwd` (`reason`), so it runs the request in `fallback`, the
    folder it started in. Sent before the request runs; the kernel warns once per pool and folder."""

    request_id: int
    rank: int
    host: str
    folder: str
    reason: str
    fallback: str


@dataclass(frozen=True)
class Event:
    """A value emitted by running code (`worker_context().emit`), e.g. training metrics."""

    request_id: int
    rank: int
    payload: Any


@dataclass(frozen=True)
class Done:
    """A request finished; `value` is its result (a call's return value, pulled values, ...)."""

    request_id: int
    rank: int
    value: Any = None


@dataclass(frozen=True)
class Failed:
    """A request raised; `traceback` shows the user's frames (cell line numbers), not nbscale's."""

    request_id: int
    rank: int
    error_type: str
    message: str
    traceback: str
    error_class: tuple[str, str] | None = None  # (module, qualname) of the exception, looked up in the notebook
    names: tuple[str, ...] = ()  # a failed spmd cell: which of its result names the worker holds after it


@dataclass(frozen=True)
class StatusReport:
    """Answer to StatusQuery (the heartbeat): memory, and where the main thread runs a request (`where`, empty
    while idle), for how many seconds it has stayed at that exact spot (`still_s`), and the spmd collective it is
    in (`collective`, "allreduce#2": the helper and its number in the request; empty when in none)."""

    request_id: int
    rank: int
    memory_mb: float
    device_memory_mb: float | None
    where: str = ""
    still_s: float = 0.0
    collective: str = ""
