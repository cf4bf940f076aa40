"""Training runs on pool workers (parfeval for trainNetwork): `train_async` and the `TrainingRun` future.

One run trains one network on one worker, in-process there (no DDP), on that worker's device. The worker sends
its training events to the notebook in small bunches through `nbscale.pool.plumbing.submit_with_events`; they are
recorded in `run.info` as they arrive (on the pool's receiver thread), so a display (`nbscale.show(run)`, the
sweep figure) can draw the run live while the notebook stays free. `TrainingRun` is a `concurrent.futures.Future` whose
result is `(net, info)`: `wait`, `as_completed` and `add_done_callback` work as usual.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nbscale.pool import active_stops
from nbscale.training.event_bunches import EventBunches
from nbscale.training.events import IterationDone, TrainingDone, TrainingStarted
from nbscale.training.info import TrainingInfo
from nbscale.training.options import TrainingOptions, as_options
from nbscale.training.run_inputs import CheckedInputs

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool
    from nbscale.training.plan import RunPlan

STOPPED_ON_REQUEST = "Stopped on request"  # what the worker says when the notebook stopped the run


class TrainingRun(Future[Any]):
    """A training run submitted to the pool: a Future of `(net, info)` with live progress.

    `info` fills as the run trains; `state` is "queued", "running", "done", "failed" or "cancelled";
    `cancel()` stops a queued or running run at once (its worker is then free for the next one) and
    `stop()` asks a running one to stop at the end of its iteration and return the network so far.
    """

    def __init__(self, name: str = "run", params: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.name = name
        self.params = dict(params or {})
        self.options: TrainingOptions | None = None  # what the run trains with
        self.seed: int | None = None  # the sweep's seed, for a seeded run
        self.info = TrainingInfo()
        self.net: nn.Module | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.pool: Any = None
        self._task: Future[Any] | None = None
        self._listeners: list[Callable[[TrainingRun], None]] = []
        self._event_listeners: list[Callable[[Any], None]] = []  # each training event, as it arrives
        self._final_state: str | None = None
        self._stop_reason: str | None = None  # who asked it to stop first (`stop`, `request`): the run's reason
        self._lock = threading.Lock()

    # ---- the pool side --------------------------------------------------------------------------------------

    def _attach(self, pool: Pool, task: Future[Any]) -> None:
        self.pool, self._task = pool, task
        active_stops.add(self)  # until it ends: a SLURM allocation's time limit stops it as Stop does
        task.add_done_callback(self._task_done)

    def _on_event(self, rank: int, events: object) -> None:
        """Events from the worker (receiver thread): record them and tell the listeners."""
        with self._lock:
            for event in events if isinstance(events, list) else [events]:
                if isinstance(event, TrainingStarted) and self.started_at is None:
                    self.started_at = time.time()
                event = self._with_stop_reason(event)
                self.info.record(event)
                for listener in self._event_listeners:
                    listener(event)
        self._notify()

    def _with_stop_reason(self, event: object) -> object:
        """`event`, its stop reason the one `request` gave when the worker only knows it was asked to stop."""
        if isinstance(event, TrainingDone) and event.stop_reason == STOPPED_ON_REQUEST and self._stop_reason:
            return dataclasses.replace(event, stop_reason=self._stop_reason)
        return event

    def _task_done(self, task: Future[Any]) -> None:
        self.ended_at = time.time()
        active_stops.discard(self)
        # the listeners (displays) hear the outcome before the result is out, so that a cell waiting for
        # run.result() ends with the final figure
        if task.cancelled() or isinstance(task.exception(), CancelledError):
            self._final_state = "cancelled"
            self.info.stop_reason = self.info.stop_reason or "Cancelled"
            self._notify()
            self._cancel_and_notify()
        elif task.exception() is not None:
            self._final_state, self.error = "failed", str(task.exception())
            self._notify()
            self.set_exception(task.exception())
        else:
            self.net, self.info = task.result()
            if self.info.stop_reason == STOPPED_ON_REQUEST and self._stop_reason:
                self.info.stop_reason = self._stop_reason
            self._final_state = "done"
            self._notify()
            self.set_result((self.net, self.info))

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:  # a broken display must not break the pool's receiver thread
                pass

    def subscribe_events(
        self, listener: Callable[[Any], None], history: Callable[[TrainingRun], list[Any]] | None = None
    ) -> None:
        """Call `listener(event)` with each training event from now on (on the pool's thread: keep it short),
        after the events `history(run)` rebuilds of what came before (none lost or repeated between them)."""
        with self._lock:
            for event in history(self) if history is not None else ():
                listener(event)
            self._event_listeners.append(listener)

    def subscribe(self, listener: Callable[[TrainingRun], None]) -> None:
        """Call `listener(run)` after every bunch of events and when the run ends (on the pool's thread)."""
        self._listeners.append(listener)

    # ---- the user side --------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self._final_state is not None:
            return self._final_state
        if self.cancelled():
            return "cancelled"
        if self.done():
            return "failed" if self.exception() is not None else "done"
        if self._task is not None and self._task.running():
            return "running"
        return "queued"

    def cancel(self) -> bool:
        """Cancel the run: never start it if queued, interrupt it if running. False when it already ended."""
        if self.done():
            return False
        if self._task is None:
            return self._cancel_and_notify()
        return bool(self.pool.cancel(self._task))

    def _cancel_and_notify(self) -> bool:
        # Future.cancel alone leaves the state CANCELLED, which concurrent.futures.wait and as_completed never
        # count as done (an executor moves it on when its worker dequeues the item); this Future has no executor,
        # so it moves on itself
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()
        return True

    def stop(self) -> None:
        """Ask a running run to stop at the end of its current iteration; it then ends "done" with the net so far."""
        self.request(STOPPED_ON_REQUEST)

    def request(self, reason: str) -> None:
        """`stop()`, with `reason` as the run's `info.stop_reason` (the first reason given wins). A queued run is
        not reached, as by `stop()`: the caller asks again (the SLURM time limit's watch asks every 2 s)."""
        if self._task is not None and self._task.running() and not self.done():
            self._stop_reason = self._stop_reason or reason
            self.pool.request_stop(self._task)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return (
            f"<TrainingRun {self.name} ({params}) {self.state}>"
            if params
            else f"<TrainingRun {self.name} {self.state}>"
        )


@dataclass(frozen=True)
class SeededStart:
    """Where a seeded run's random numbers start: as in `torch.manual_seed(seed); model = make_model()`, then
    `nbscale.train(model, ...)`, which draws `data_order_seed` and goes on from `random_state`."""

    seed: int
    data_order_seed: int
    random_state: torch.Tensor  # torch's CPU generator after building the model and drawing data_order_seed


def seeded_model(make_model: Callable[[], nn.Module] | nn.Module, seed: int) -> tuple[nn.Module, SeededStart]:
    """The network `torch.manual_seed(seed); make_model()` builds, and where its run's random numbers start.

    The caller's random stream is left as it was.
    """
    from nbscale.training.trainer import draw_seed

    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        model = fresh_model(make_model)
        data_order_seed = draw_seed()
        return model, SeededStart(seed, data_order_seed, torch.get_rng_state())


def train_async(
    model: nn.Module,
    train_data: Any,
    options: TrainingOptions | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | str | None = None,
    pool: Any = None,
    name: str = "run",
    params: dict[str, Any] | None = None,
    seeded: SeededStart | None = None,
    step_fn: Callable[..., Any] | None = None,
) -> TrainingRun:
    """Train `model` on one free worker of `pool` (default: the current pool, started if none runs).

    Returns at once with a `TrainingRun` (a Future of `(net, info)`); `nbscale.show(run)` draws its progress live
    without blocking the notebook. The run trains a copy of `model` on its worker's device; the notebook's model
    is left untouched. `options.execution_environment`, `worker_load`, `plots` and `verbose` do not apply (one
    run, one worker); `output_fn` runs on the worker. `seeded` (from `seeded_model`) makes the run draw the
    random numbers that `nbscale.train` would after `torch.manual_seed(seeded.seed)` and building `model`.
    """
    from nbscale.training.trainer import checked_inputs

    checked = checked_inputs(model, train_data, as_options(options), loss_fn, step_fn, one_worker=True)
    return submit_run(model, checked, pool, name, params, seeded)


def submit_run(
    model: nn.Module,
    checked: CheckedInputs,
    pool: Any = None,
    name: str = "run",
    params: dict[str, Any] | None = None,
    seeded: SeededStart | None = None,
) -> TrainingRun:
    """`train_async` of inputs already checked: `checked` is what nbscale.training.trainer.checked_inputs
    returned for `model` (with one_worker=True) (nbscale.sweep checks every run before any starts)."""
    from nbscale.pool.plumbing import submit_with_events
    from nbscale.pool.pool import current_pool
    from nbscale.training.batch_fitting import check_auto_batch_device
    from nbscale.training.plan import without_listeners

    plan = checked.plan
    pool = pool if pool is not None else current_pool(start=True)
    check_auto_batch_device(plan.batching, pool.kind == "gpu", "the pool's CPU workers")
    run = TrainingRun(name, params)
    run.options, run.seed = checked.options, seeded.seed if seeded is not None else None
    output_fn = plan.listeners.output_fn  # runs on the worker, beside the run's own info
    task = submit_with_events(
        pool, train_run_on_worker, run._on_event, model, checked.data, without_listeners(plan), output_fn, seeded
    )
    run._attach(pool, task)
    return run


def train_run_on_worker(
    model: nn.Module,
    train_data: object,
    plan: RunPlan,
    output_fn: Callable[[TrainingInfo], object] | None = None,
    seeded: SeededStart | None = None,
) -> tuple[nn.Module, TrainingInfo]:
    """What the worker of a `train_async` run executes: the whole training loop on this one worker's device,
    events sent to the notebook (unlike nbscale.training.distributed.train_on_worker, one rank of a DDP run)."""
    from nbscale.data.loading import as_dataset
    from nbscale.pool.context import worker_context
    from nbscale.training.batch_fitting import batch_counts
    from nbscale.training.loop import run_training
    from nbscale.training.loop_setup import Where, loop_setup
    from nbscale.training.trainer import draw_seed

    context = worker_context()
    dataset = as_dataset(train_data)
    info = TrainingInfo()
    sender = EventBunches(context.emit)
    stop_reason: list[str] = []

    def publish(event: object) -> None:
        info.record(event)
        sender.send(event)
        if output_fn is not None and isinstance(event, IterationDone) and output_fn(info) is True:
            stop_reason.append("Stopped by output_fn")

    def stop() -> str | None:
        if context.stop_requested:
            return STOPPED_ON_REQUEST
        return stop_reason[0] if stop_reason else None

    device = context.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if seeded is not None:  # as after torch.manual_seed(seed), which seeds the GPUs too, and building the model
        torch.cuda.manual_seed_all(seeded.seed)
        torch.set_rng_state(seeded.random_state)
    try:
        result = run_training(
            loop_setup(
                model,
                dataset,
                plan,
                device=device,
                seed=seeded.data_order_seed if seeded is not None else draw_seed(),
                hardware=f"worker {context.rank} ({device})",
                publish=publish,
                stop_reason=stop,
                # torch's Dataset declares no __len__; as_dataset checked it
                counts=batch_counts(plan.batching, len(dataset), 1),  # type: ignore[arg-type]
                # output_fn sees each iteration as it ends, and its stop lands after that one, as in the notebook
                where=Where(read_each_iteration=output_fn is not None),
            )
        )
    finally:
        sender.flush()
    info.stop_reason = info.stop_reason or result.stop_reason
    return model.cpu(), info


def fresh_model(make_model: Callable[[], nn.Module] | nn.Module) -> nn.Module:
    """A new network from `make_model()`, or a deep copy of a network (every run starts from the same weights)."""
    if isinstance(make_model, nn.Module):
        return copy.deepcopy(make_model)
    model = make_model()
    if not isinstance(model, nn.Module):
        from nbscale.errors import OptionsError

        raise OptionsError(
            f"make_model must return a torch nn.Module, not {type(model).__name__}: define "
            "make_model() so that it builds and returns a fresh network."
        )
    return model
