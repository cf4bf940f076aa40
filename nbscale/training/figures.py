"""The training figures of each iteration (loss, metrics, stop requests): kept while the loop runs, read in bunches.

A read of a figure from a GPU waits for the GPU to finish everything queued, so the loop keeps each iteration's
figures where they are and reads them together, in one of two ways chosen once in setup (the loop reads
either through the `Figures` protocol):
- `LocalFigures`, in the notebook's process and on a pool where one rank has all the work: an iteration keeps
  its loss, outputs and labels; a read stacks a whole bunch and works out the metrics' states
  (`MetricSet.states`) in one computation, at
  most every READ_EVERY iterations or READ_INTERVAL seconds (so the display stays live). A read starts that
  bunch's copy to the host and reports the bunch read before it, copied long since: the loop never waits for
  the GPU in the steady state of an epoch, and the events' listeners (the progress display) run while the GPU
  works through the iterations queued after them. A read waits for its own bunch only where the loop needs it
  now (`wait`: a stop request, validation, a checkpoint, the last iteration; every read for output_fn).
- `PoolFigures`, on a pool of several ranks with work: an iteration's loss sum, sample count, stop flag and
  metric state (`MetricSet.state`: sums, so the sum over the ranks is the state of all their samples, never a
  mean of per-rank values) are summed over the ranks by the same collective as the last gradient bucket
  (`CarryingHook`, DDP's communication hook), so an iteration needs one collective, not two. Every rank reads at
  the same iterations: every iteration on CPU workers (the collective waited already), every READ_EVERY on GPUs;
  every iteration where the notebook's output_fn answers each one (nbscale.training.distributed), whose stop every
  rank then takes at once.
Figures are also read whenever an iteration needs them (validation, the end of an epoch, a stop request).
The metrics are checked against the first batch (`MetricSet.check`): a metric the user asked for that does not fit
is an OptionsError before training goes on; the default one (accuracy or rmse) that does not fit is left out, its
values None, as a custom loss's outputs may be anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nbscale.data.batches import batch_length
from nbscale.errors import OptionsError
from nbscale.training.run_metrics import MetricSet, resolve_metrics

READ_EVERY = 25  # most iterations between reads, except on a CPU pool
READ_INTERVAL = 0.2  # seconds between reads in one process, so the display stays live


@dataclass
class Pending:
    """An iteration whose figures may still be on the device."""

    epoch: int
    iteration: int
    time: float
    learn_rate: float
    images: int
    figures: Any  # what Figures.keep returned


@dataclass
class Reading:
    """An iteration's figures, read."""

    epoch: int
    iteration: int
    time: float
    learn_rate: float
    images: int
    training_loss: float
    metrics: dict[str, float | None]  # by name, every name of the run's metrics
    stops: bool

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("accuracy")


class KeptMetrics:
    """The run's metrics as the figures compute them: checked on the first batch kept, named as the run's events
    name them (`names`, fixed in setup), and turned from a state into each name's value."""

    def __init__(self, metrics: MetricSet, explicit: bool) -> None:
        self.metrics, self.names, self.explicit = metrics, metrics.names, explicit
        self.checked = False

    def check(self, outputs: Any, labels: Any) -> None:
        """Check the metrics against the first batch (once; see the module docstring)."""
        self.checked = True
        if outputs is None:  # a step_fn returning only its loss: nothing to compute metrics on
            self.metrics = resolve_metrics((), regression=False)
            return
        try:
            self.metrics.check(outputs, labels)
        except OptionsError:
            if self.explicit:
                raise
            self.metrics = resolve_metrics((), regression=False)

    @property
    def size(self) -> int:
        """The state's length; 0 before the first batch is checked (the class count comes from it)."""
        return self.metrics.size if self.checked else 0

    def values(self, state: Any) -> dict[str, float | None]:
        """Each name's value from a summed state (None for a name not computed)."""
        values = self.metrics.values(state) if self.metrics.size and len(state) == self.metrics.size else {}
        return {name: values.get(name) for name in self.names}


class Figures(Protocol):
    """What the loop reads of its figures, whichever way they are kept (LocalFigures, PoolFigures)."""

    read_every: int  # most iterations between reads
    interval: float  # most seconds between reads (math.inf: never by time)

    @property
    def unread(self) -> Bunch | None:
        """The bunch last read, still on its way to the host (None: every read is of its own bunch)."""

    def keep(self, loss: torch.Tensor, outputs: Any, labels: Any) -> Any:
        """What to keep of this iteration (called before backward): `Pending.figures`."""

    def stop_asked(self) -> bool:
        """Whether this rank should stop now, before the next read says so."""

    def read(self, pending: list[Pending], stop_asked: bool, wait: bool) -> list[Reading]:
        """The readings of the iterations read now (with `wait`, `pending`'s own among them)."""


class LocalFigures:
    """The figures of the only rank with work (see the module docstring)."""

    def __init__(
        self, stop_reason: Callable[[], str | None], read_every: int, copy_outputs: bool, metrics: KeptMetrics
    ) -> None:
        self.stop_reason, self.read_every, self.interval = stop_reason, read_every, READ_INTERVAL
        self.metrics = metrics
        self.copy_outputs = copy_outputs  # CUDA graphs (torch.compile's "reduce-overhead") reuse output memory
        self.unread: Bunch | None = None  # the bunch last read, on its way to the host

    def keep(self, loss: torch.Tensor, outputs: object, labels: object) -> Any:
        """What to keep of this iteration (called before backward); nothing is computed until read."""
        if not self.metrics.checked:
            self.metrics.check(outputs, labels)
        if isinstance(outputs, torch.Tensor):
            outputs = outputs.detach().clone() if self.copy_outputs else outputs.detach()
        return loss, outputs, labels

    def stop_asked(self) -> bool:
        """True when a stop was asked of this process (the Stop button, the interrupt, output_fn, the pool)."""
        return self.stop_reason() is not None

    def read(self, pending: list[Pending], stop_asked: bool, wait: bool) -> list[Reading]:
        """The figures of the bunch read before (no wait: they were copied while this bunch trained); this
        bunch's copy is started, and with `wait` (or reads every iteration) its figures follow them."""
        bunches = [
            bunch
            for bunch in (self.unread, Bunch(pending, stop_asked, self.metrics) if pending else None)
            if bunch is not None
        ]
        self.unread = None
        if pending and not wait and self.read_every > 1:
            self.unread = bunches.pop()
        return [reading for bunch in bunches for reading in bunch.readings()]


class Bunch:
    """A bunch of iterations' figures, stacked on their device and copying to the host."""

    @torch.no_grad()  # the figures are the iterations' loss, not detached
    def __init__(self, pending: list[Pending], stop_asked: bool, metrics: KeptMetrics) -> None:
        rows = torch.stack([p.figures[0].float() for p in pending])[:, None]
        if metrics.size and all(p.figures[1] is not None for p in pending):
            try:
                states = metrics.metrics.states([p.figures[1:] for p in pending])
            except OptionsError as error:  # which iterations: their metrics are computed together
                where = f"{pending[0].iteration}" + (f"-{pending[-1].iteration}" if len(pending) > 1 else "")
                raise OptionsError(f"{error} (at iteration {where})") from error.__cause__
            rows = torch.cat([rows, states.to(rows.device)], 1)
        for p in pending:  # the outputs and labels are freed now, not when the bunch is reported
            p.figures = None
        self.pending, self.stop_asked, self.metrics = pending, stop_asked, metrics
        self.rows, self.copied = rows, None
        if rows.is_cuda:  # into pinned memory, behind the bunch's iterations on the stream
            self.rows, self.copied = rows.to("cpu", non_blocking=True), torch.cuda.Event()
            self.copied.record()

    def readings(self) -> list[Reading]:
        """The figures as read on the host (waiting for the copy if it is still under way)."""
        if self.copied is not None:
            self.copied.synchronize()
        rows = self.rows.tolist()
        readings = [
            Reading(
                p.epoch,
                p.iteration,
                p.time,
                p.learn_rate,
                p.images,
                row[0],
                self.metrics.values(row[1:]) if len(row) > 1 else self.metrics.values([]),
                False,
            )
            for p, row in zip(self.pending, rows, strict=True)
        ]
        readings[-1].stops = self.stop_asked
        return readings


class PoolFigures:
    """The figures of a pool's ranks with work, summed with the last gradient bucket (see the module docstring)."""

    def __init__(
        self,
        hook: CarryingHook,
        group: torch.distributed.ProcessGroup | None,
        device: torch.device,
        stop_reason: Callable[[], str | None],
        metrics: KeptMetrics,
        answered_each_iteration: bool = False,
    ) -> None:
        self.hook, self.group, self.device, self.stop_reason = hook, group, device, stop_reason
        self.metrics = metrics
        # with output_fn, every rank waits for the notebook's answer to each iteration, so all see its stop at once
        self.answered_each_iteration = answered_each_iteration
        self.read_every = 1 if device.type == "cpu" or answered_each_iteration else READ_EVERY
        self.interval = math.inf  # never by time: every rank must read at the same iterations
        self.one = torch.ones((), device=device)

    @torch.no_grad()
    def keep(self, loss: torch.Tensor, outputs: Any, labels: Any) -> Carried:
        """Hand this iteration's figures to the hook (called before backward, so the last bucket carries them)."""
        if not self.metrics.checked:
            self.metrics.check(outputs, labels)
        stops = 1.0 if self.stop_reason() else 0.0
        count = batch_length(labels)
        figures = torch.stack([loss.detach().float() * count, self.one * count, self.one * stops])
        if self.metrics.size:  # the same on every rank: their first batches have the same shapes
            figures = torch.cat([figures, self.metrics.metrics.state(outputs.detach(), labels).to(self.device)])
        carried = Carried(figures)
        self.hook.carried = carried
        return carried

    def stop_asked(self) -> bool:
        # a stop travels in the summed figures, so every rank stops at the same iteration; an answer to an
        # iteration reaches every rank before it goes on, so that stop is taken at once
        return self.answered_each_iteration and self.stop_reason() is not None

    unread = None  # every read is of its own bunch: the figures came with the last gradient bucket

    def read(self, pending: list[Pending], stop_asked: bool, wait: bool) -> list[Reading]:
        summed = [p.figures.summed(self.group) for p in pending]
        rows = (torch.stack(summed) if len(summed) > 1 else summed[0][None]).tolist()
        return [
            Reading(
                p.epoch,
                p.iteration,
                p.time,
                p.learn_rate,
                p.images,
                row[0] / max(row[1], 1),
                self.metrics.values(row[3:]),
                row[2] > 0,
            )
            for p, row in zip(pending, rows, strict=True)
        ]


class Carried:
    """One iteration's figures on their way through the gradient all-reduce."""

    def __init__(self, figures: torch.Tensor) -> None:
        self.figures = figures
        self.reduced: torch.Tensor | None = None

    def summed(self, group: torch.distributed.ProcessGroup | None) -> torch.Tensor:
        """The figures summed over the ranks (an all-reduce of their own when no bucket could carry them)."""
        if self.reduced is None:
            torch.distributed.all_reduce(self.figures, group=group)
            self.reduced = self.figures
        return self.reduced


class CarryingHook:
    """DDP communication hook: sums each gradient bucket over the ranks, each rank's gradients weighted by its
    share of the global mini-batch (so the sum is the gradient of the global mini-batch's mean loss, whatever the
    shares), and carries the iteration's figures (`carried`) with the last bucket."""

    def __init__(self, group: torch.distributed.ProcessGroup | None, share: float) -> None:
        self.group, self.share = group, share
        self.carried: Carried | None = None

    # unannotated: DDP rejects annotations other than its own objects, and this module's are strings
    def reduce(self, state, bucket):  # type: ignore[no-untyped-def]
        gradients = bucket.buffer()
        gradients.mul_(self.share)
        carried = self.carried if bucket.is_last() and gradients.dtype == torch.float32 else None
        size = gradients.numel()
        tensor = torch.cat([gradients, carried.figures]) if carried is not None else gradients
        if carried is not None:
            self.carried = None

        def done(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            reduced = future.value()[0]
            if carried is None:
                return reduced
            carried.reduced = reduced[size:]
            return reduced[:size]

        future = torch.distributed.all_reduce(tensor, group=self.group, async_op=True).get_future()
        return future.then(done)
