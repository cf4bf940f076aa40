"""Training on the worker pool ("parallel", "multi-gpu").

Every worker runs the same loop (`nbscale.training.loop`) on its share of each global mini-batch; the shares
follow worker_load, and a worker with load 0 sits out (the others train in a torch.distributed subgroup).
Gradients are averaged by DistributedDataParallel (gloo on CPU workers, NCCL on GPUs). Where one worker has all
the work (a pool of one, or worker_load leaving the others out) it trains as the notebook's process would: no
group, no DDP, no per-iteration collective. The first worker with
work sends the training events to the notebook in small bunches, where they drive the same display, verbose
table, output_fn and info as in-process training; it also writes the checkpoints and returns the trained
weights, which are loaded into the notebook's model. With output_fn, every iteration's event goes at once and
every rank waits for the notebook's answer to it (a message to the running request, nbscale.pool.plumbing), so
output_fn stops the pool after the iteration it saw, as it does in the notebook's process.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nbscale.errors import OptionsError, UnsendableError, WorkerError
from nbscale.pool.plumbing import message_running_request
from nbscale.pool.requests import tells_of_a_torn_down_group, worker_error_as
from nbscale.pool.settings import PoolSettings
from nbscale.training.batch_fitting import batch_counts, check_auto_batch_device
from nbscale.training.event_bunches import EventBunches
from nbscale.training.events import EventChannel, IterationDone, PreparingData, StopSignal
from nbscale.training.loop import run_training
from nbscale.training.loop_setup import LoopResult, Where, loop_setup
from nbscale.training.plan import RunPlan, without_listeners
from nbscale.user_warnings import warn_user

if TYPE_CHECKING:
    from nbscale.pool.context import WorkerContext
    from nbscale.pool.pool import Pool


@dataclass
class WorkerJob:
    """What every worker receives (cloudpickled once per run)."""

    model: nn.Module
    train_data: Any
    plan: RunPlan  # the run's resolved choices (nbscale.training.plan), read by every rank's loop; no listeners
    seed: int
    resume: dict[str, Any] | None
    counts: list[int]
    hardware: str
    answered: bool = False  # with output_fn: every iteration waits for the notebook's answer to it


def train_on_pool(
    model: nn.Module,
    dataset: Any,
    plan: RunPlan,
    seed: int,
    resume: dict[str, Any] | None,
    channel: EventChannel,
    stop: StopSignal,
) -> LoopResult:
    """Run the loop on the pool for the plan's execution environment; loads the result into `model`."""
    pool = _pool_for(plan.placement.environment)
    check_auto_batch_device(plan.batching, pool.kind == "gpu", "the pool's CPU workers")
    counts = batch_counts(plan.batching, len(dataset), pool.size)  # for "auto", which workers have work
    backend = "NCCL" if pool.kind == "gpu" else "gloo"
    hardware = _hardware_line(pool.devices, counts, backend)
    # the notebook keeps output_fn, plots and the table; workers only train. With output_fn every rank waits for
    # its answer to each iteration, so a stop it asks for lands after the iteration it saw, as in the notebook
    answered = plan.listeners.reads_each_iteration
    job = WorkerJob(model.cpu(), dataset, without_listeners(plan), seed, resume, counts, hardware, answered)

    preparing = _PreparingTotals()
    listener_failures: list[Exception] = []

    def on_event(rank: int, events: Any) -> None:
        if not listener_failures:
            try:
                channel.publish(preparing.combined(rank, events))
            except Exception as error:  # output_fn (or a display) failed: stop the workers, raise it once they are
                listener_failures.append(error)
                stop.request("Stopped: a training listener failed")
        iterations = [event.iteration for event in events if isinstance(event, IterationDone)]
        if answered and iterations:  # go on, or stop after that iteration
            message_running_request(pool, (max(iterations), stop.requested))
        if stop.requested:  # asked again: a stop asked while the pool started or the run was queued is lost there
            pool.request_stop()

    stop.on_request.append(pool.request_stop)
    out_of_memory: WorkerError | None = None
    try:
        results = pool.run(train_on_worker, job, on_event=on_event)
    except WorkerError as error:
        failure = _training_failure(error, plan.checkpoint.path)
        if not any(_ran_out_of_memory(text) for text in failure.failures.values()):
            raise failure from None
        # a WorkerError that is also the notebook's torch.OutOfMemoryError, raised below, after the handler
        out_of_memory = worker_error_as(torch.OutOfMemoryError, str(failure), failure.failures)
    except UnsendableError as error:
        raise UnsendableError(_unsendable(job) or str(error)) from None
    finally:
        stop.on_request.remove(pool.request_stop)
    _raise_first(out_of_memory, listener_failures)
    result = next(r for r in results if r is not None)
    model.load_state_dict(result.state_dict)
    for message in result.warnings:  # once, in the notebook, at the user's line (as training there warns)
        warn_user(message, RuntimeWarning)
    return result


def _raise_first(out_of_memory: WorkerError | None, listener_failures: list[Exception]) -> None:
    """Raise what ended a pool run after its handlers let go: the out-of-memory error (the type training in the
    notebook raises: nbscale.training.out_of_memory), else a training listener's failure."""
    if out_of_memory is not None:
        raise out_of_memory
    if listener_failures:
        raise listener_failures[0]


def _hardware_line(devices: list[str], counts: list[int], backend: str) -> str:
    """The header's hardware: the workers with work, their devices and backend, and those that sit out."""
    used = [device for device, count in zip(devices, counts, strict=True) if count > 0]
    idle = [str(rank) for rank, count in enumerate(counts) if count == 0]  # MATLAB's WorkerLoad 0: the worker sits out
    line = f"{len(used)} worker{'s' * (len(used) != 1)} ({', '.join(used)}; {backend})"
    if idle:
        line += f"; worker{'s' * (len(idle) > 1)} {', '.join(idle)} sit{'s' * (len(idle) == 1)} out (worker_load 0)"
    return line


def _raise_out_of_memory(message: str | None, device: torch.device) -> None:
    """torch.OutOfMemoryError (the type the notebook raises, on any rank) with `message`, the cache emptied."""
    if message is not None:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise torch.OutOfMemoryError(message)


def _answering(
    job: WorkerJob, context: WorkerContext, publish: Callable[[Any], None], sender: EventBunches
) -> tuple[Callable[[Any], None], Callable[[], str | None]]:
    """How a worker publishes and when it stops: on its stop requests, or (with output_fn) on the notebook's
    answers alone, which every rank has the same at the same iteration."""
    if not job.answered:

        def stop_reason() -> str | None:
            return "Stopped on request" if context.stop_requested else None

        return publish, stop_reason
    answers = _Answers(context)

    def answered_stop_reason() -> str | None:
        return "Stopped on request" if answers.stop else None

    return _answered(publish, sender, answers), answered_stop_reason


def train_on_worker(job: WorkerJob) -> LoopResult | None:
    """The function every pool worker runs: join the group of ranks with work and run the loop."""
    from nbscale.pool.context import worker_context

    context = worker_context()
    active = tuple(rank for rank, count in enumerate(job.counts) if count > 0)
    # every rank must take part in creating the group; one rank with work needs none (every rank knows that)
    group = _training_group(active) if len(active) > 1 else None
    if context.rank not in active:
        return None
    is_main = context.rank == active[0]
    sender = EventBunches(context.emit)
    device = context.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    publish, stop_reason = _answering(job, context, sender.send if is_main else _preparing_only(sender), sender)
    warnings: list[str] = []  # the main rank's, warned of in the notebook

    out_of_memory: str | None = None  # raised after the handler, so that it holds none of the run's frames
    try:
        result = run_training(
            loop_setup(
                job.model,
                job.train_data,
                job.plan,
                device=device,
                seed=job.seed,
                hardware=job.hardware,
                publish=publish,
                stop_reason=stop_reason,
                counts=job.counts,
                where=Where(
                    resume=job.resume,
                    rank=context.rank,
                    group=group,
                    is_main=is_main,
                    warn=warnings.append if is_main else None,
                    read_each_iteration=job.answered,
                ),
            )
        )
        result.warnings = warnings
        result.state_dict = _weights_for_the_notebook(job.model) if is_main else {}
    except BaseException as error:
        # let go of what holds the group (the failed step's frames, compiled code), so tearing it down below closes
        # its connections: a gloo peer waits in its collective until they close (the traceback's text stays)
        traceback.clear_frames(error.__traceback__)
        _forget_compiled(job.plan.placement.compile, always_collect=True)
        # the rank where the error began tears the group down, which wakes the others out of their collectives;
        # a rank woken that way only lets go of it (destroying it then can kill the process: gloo's threads are
        # still winding down)
        _abort(active, destroy=not _woken_by_a_peer(error))
        if not isinstance(error, torch.OutOfMemoryError):
            raise
        out_of_memory = _out_of_memory(error, job, context.rank, device)
    finally:
        sender.flush()
    _raise_out_of_memory(out_of_memory, device)
    _forget_compiled(job.plan.placement.compile)
    return result if is_main else None


def _weights_for_the_notebook(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained weights as they are: the pool's transport copies them out (a GPU's come to the CPU first)."""
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


def _out_of_memory(error: torch.OutOfMemoryError, job: WorkerJob, rank: int, device: torch.device) -> str:
    """What a worker that ran out of GPU memory says: which mini-batch size to lower."""
    if job.plan.batching.mini_batch_size == "auto":
        return (
            f"Out of GPU memory on worker {rank} ({device}) with mini_batch_size='auto' (its probe left too "
            "little memory for the rest of training): give mini_batch_size a number below the one it chose. "
            f"{error}"
        )
    return (
        f"Out of GPU memory on worker {rank} ({device}) with {job.counts[rank]} samples per iteration: lower "
        f"mini_batch_size (now {sum(job.counts)}). {error}"
    )


def _forget_compiled(compiled: object, always_collect: bool = False) -> None:
    """Drop torch.compile's caches after a compiled run: they hold the run's DistributedDataParallel wrapper,
    with its gradient buckets and the training group, which a later failure must be able to tear down (a gloo
    peer otherwise waits in its collective for the group's timeout). The next compiled run compiles again, from
    inductor's cache on disk."""
    if compiled:
        torch.compiler.reset()
    if compiled or always_collect:
        gc.collect()  # the wrapper sits in reference cycles


_GROUPS: dict[tuple[int, ...], Any] = {}


def _training_group(active: tuple[int, ...]) -> torch.distributed.ProcessGroup | None:
    """A group of its own for training (kept between runs), so aborting it leaves the pool's group intact; None
    on a rank outside `active` (which trains nothing)."""
    import torch.distributed as dist

    if active not in _GROUPS:
        _GROUPS[active] = dist.new_group(list(active))
    group = _GROUPS[active]
    return group if isinstance(group, dist.ProcessGroup) else None


def _abort(active: tuple[int, ...], destroy: bool = True) -> None:
    """Tear down the training group after a failure: peers blocked in it get an error instead of hanging."""
    import torch.distributed as dist

    group = _GROUPS.pop(active, None)
    if group is None or not destroy:
        return
    try:
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None and dist.get_backend(group) == "nccl":
            abort(group)
        else:
            dist.destroy_process_group(group)
    except Exception:
        pass


def _woken_by_a_peer(error: BaseException) -> bool:
    """True for the error a collective raises when another rank tore the group down."""
    return isinstance(error, torch.distributed.DistError) or tells_of_a_torn_down_group(str(error))


class _Answers:
    """On a worker: the notebook's answers to the iterations its output_fn saw, each `(iteration, stop)` sent as
    a message to the running request (train_on_pool's on_event)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.answered = 0  # the last iteration answered
        self.stop = False  # whether an answer said stop

    def wait_for(self, iteration: int) -> None:
        """Block until the notebook answered `iteration`."""
        while self.answered < iteration:
            answered, stop = self.context.next_message()
            self.answered, self.stop = max(self.answered, answered), self.stop or stop


def _answered(publish: Callable[[Any], None], sender: EventBunches, answers: _Answers) -> Callable[[Any], None]:
    """`publish`, then, after each iteration, wait for the notebook's answer to it (its output_fn ran there)."""

    def publish_and_wait(event: object) -> None:
        publish(event)
        if isinstance(event, IterationDone):
            sender.flush()
            answers.wait_for(event.iteration)

    return publish_and_wait


def _preparing_only(sender: EventBunches) -> Callable[[Any], None]:
    """What a rank other than the first sends: only how far it read its share of the data (the notebook adds
    the ranks up: _PreparingTotals)."""

    def publish(event: object) -> None:
        if isinstance(event, PreparingData):
            sender.send(event)

    return publish


class _PreparingTotals:
    """In the notebook: the ranks' PreparingData added up into one event for the display (each rank counts the
    items of its own share, of all the items)."""

    def __init__(self) -> None:
        self.ranks: dict[str, dict[int, PreparingData]] = {}

    def combined(self, rank: int, events: object) -> Any:
        """`events` (one or a bunch) with each PreparingData replaced by the sum over the ranks so far."""
        if not isinstance(events, list):
            return self.combined(rank, [events])[0]
        return [self._total(rank, event) if isinstance(event, PreparingData) else event for event in events]

    def _total(self, rank: int, event: PreparingData) -> PreparingData:
        latest = self.ranks.setdefault(event.what, {})
        latest[rank] = event
        return PreparingData(event.what, sum(e.done for e in latest.values()), event.total, event.unit)


def multi_gpu_pool_settings() -> PoolSettings:
    """The pool "multi-gpu" starts when none runs: `%pool start` without arguments, one worker per free GPU (GPUs
    another notebook or process holds are left alone, as nbscale.pool.devices plans; every GPU held is an error
    naming the holders)."""
    return PoolSettings()


def _pool_for(environment: str) -> Pool:
    from nbscale.pool.pool import current_pool, open_pool

    pool = current_pool(start=False)
    if environment == "parallel":
        return open_pool()
    if pool is not None:
        if pool.kind != "gpu":
            raise OptionsError(
                "execution_environment='multi-gpu' needs GPU workers but the running pool has CPU "
                "workers: use execution_environment='parallel', or stop that pool (%pool stop, or "
                "nbscale.current_pool().close()) and train again."
            )
        return pool
    if not torch.cuda.is_available():
        raise OptionsError(
            "execution_environment='multi-gpu' needs GPUs and none is visible: use 'parallel' (CPU workers) or 'cpu'."
        )
    pool = open_pool(multi_gpu_pool_settings())
    if pool.kind != "gpu":  # CUDA sees a GPU that NVML, which pools plan from, does not list
        pool.close()
        raise OptionsError(
            "execution_environment='multi-gpu' found no GPU to start a worker on (NVML lists none; "
            "%gpu shows what it sees): train with execution_environment='gpu' instead."
        )
    return pool


def _training_failure(error: WorkerError, checkpoints: str | None) -> WorkerError:
    """The error of a failed pool run, told from the rank(s) where it began: a rank that only stopped because
    the failing rank tore the training group down is named without its traceback (gloo's 'Connection reset by
    peer')."""
    failures = error.failures
    origin = {rank: text for rank, text in failures.items() if not tells_of_a_torn_down_group(text)} or failures
    if not origin:
        return WorkerError(_with_recovery_hint(str(error), checkpoints))
    ranks, woken = sorted(origin), sorted(set(failures) - set(origin))
    which = f"worker {ranks[0]}" if len(ranks) == 1 else f"workers {', '.join(map(str, ranks))}"
    parts = [
        f"Training failed on {which}"
        + (f" (worker{'s' * (len(woken) > 1)} {', '.join(map(str, woken))} stopped with it)." if woken else ".")
    ]
    parts += [f"\n--- rank {rank} ---\n{origin[rank].rstrip()}" for rank in ranks]
    return WorkerError(_with_recovery_hint("\n".join(parts), checkpoints), origin)


def _ran_out_of_memory(failure: str) -> bool:
    """Whether a rank's traceback ends in torch's out-of-memory error (train_on_worker raises it)."""
    lines = failure.rstrip().splitlines()
    return bool(lines) and lines[-1].startswith("torch.OutOfMemoryError: ")


def _with_recovery_hint(message: str, checkpoints: str | None) -> str:
    """`message` with what to do next (`checkpoints`: the run's checkpoint folder, or None)."""
    hint = "\n\nTraining stopped."
    if checkpoints:
        from nbscale.training.checkpoint import latest_checkpoint

        last = latest_checkpoint(checkpoints)
        if last is not None:
            hint += (
                f" The last checkpoint ({last}) is intact: continue with "
                f"nbscale.train(..., resume_from={checkpoints!r})."
            )
    # torch's error, not any text with the words ("stopped answering: ... or out of memory" is a heartbeat's)
    if ("OutOfMemoryError" in message or "CUDA out of memory" in message) and "mini_batch_size" not in message:
        hint += " Out of GPU memory: lower mini_batch_size."
    return message + hint


def _unsendable(job: WorkerJob) -> str | None:
    """Name the first part of the job that cloudpickle cannot send to the workers."""
    import cloudpickle

    parts = (
        ("the model", job.model),
        ("train_data", job.train_data),
        ("validation_data", job.plan.validation_data),
        ("loss_fn", job.plan.loss_fn),
        ("step_fn", job.plan.step_fn),
    )
    for name, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception as error:
            return (
                f"{name} cannot be sent to the pool's workers ({type(error).__name__}: {error}). Define it "
                "from picklable parts (no open files, locks or generators), or train with "
                "execution_environment='auto'."
            )
    return None
