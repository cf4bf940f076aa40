"""The training loop, the same in the notebook's process and on every pool worker.

Reads top to bottom, like airbench: setup chooses every variant once (the data source, precision and loss
scaling, channels_last, DistributedDataParallel on a pool, torch.compile, gradient clipping, how the figures are
kept), then per epoch and per iteration the step itself (forward, loss, backward, clip, step), the bunched reads
of the figures with the stop checks, validation, events, and a checkpoint per epoch.
On a pool each rank trains on its share of every global mini-batch, and DDP's communication hook sums the
gradients weighted by the ranks' shares (nbscale.train.figures), so the update equals the single-process one.
A pool where one rank has all the work runs the loop as in one process: no DDP, no per-iteration collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbscale.outputs import main_output
from nbscale.train.batch_fitting import gpu_probe, no_probe, out_of_memory, settle, smallest_over, untouched
from nbscale.train.batches import batch_length, call_model
from nbscale.train.checkpoint import prepare_folder, save_checkpoint
from nbscale.train.checks import misfit_error
from nbscale.train.compiling import compiled_network
from nbscale.train.events import IterationDone, PreparingData, TrainingDone, TrainingStarted
from nbscale.train.figures import READ_EVERY, CarryingHook, LocalFigures, Pending, PoolFigures, correct
from nbscale.train.layout import layout_restored, train_channels_last
from nbscale.train.loading import BatchSource, StreamBatches, make_batch_source
from nbscale.train.optimizer import make_optimizer
from nbscale.train.options import TrainingOptions
from nbscale.train.preparing import Progress, Readers
from nbscale.train.schedules import learn_rate_schedule
from nbscale.user_warnings import warn_user


@dataclass
class LoopSetup:
    """Everything one process needs to run the loop."""

    model: nn.Module
    train_data: Any  # a Dataset
    options: TrainingOptions
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: torch.device
    seed: int
    hardware: str
    publish: Callable[[Any], None]  # the event channel (rank 0) or a no-op
    stop_reason: Callable[[], str | None]  # polled at the end of each iteration
    validation_data: Any = None
    resume: dict[str, Any] | None = None
    counts: list[int] = field(default_factory=lambda: [0])  # samples per rank in each global batch
    rank: int = 0
    group: Any = None  # torch.distributed group of the ranks with work, when more than one has work; else None
    is_main: bool = True  # writes checkpoints
    # tells the user what the run changed or why it ended (a RuntimeWarning here; a pool's main rank sends them
    # to the notebook, which warns there once, at the user's line); None on a pool's other ranks
    warn: Callable[[str], None] | None = field(default=lambda message: warn_user(message, RuntimeWarning))
    # a listener needs every iteration's figures at once (output_fn; on a pool publish waits for its answer)
    read_each_iteration: bool = False


@dataclass
class LoopResult:
    stop_reason: str
    state_dict: dict[str, torch.Tensor]
    output_network_iteration: int
    iteration: int
    warnings: list[str] = field(default_factory=list)  # on a pool, what the notebook must warn of


def run_training(setup: LoopSetup) -> LoopResult:
    """Train `setup.model` in place; returns the output network's state and why training ended."""
    with _cheap_garbage_collection(), layout_restored(setup.model), _cudnn_setting_restored(), \
            contextlib.ExitStack() as closing:
        return _train(setup, closing)


def _train(setup: LoopSetup, closing: contextlib.ExitStack) -> LoopResult:
    """The loop; `closing` stops the data's background processes when it ends, however it ends."""
    device, loss_fn = setup.device, setup.loss_fn

    # ---- the data, read and held where training runs (on a pool each rank reads a block and they share them),
    # before the clock starts: info.prepare_seconds, not training time --------------------------------------------
    model = setup.model.to(device)
    options = setup.options
    # the scaler scales fp16 losses, else passes
    autocast_dtype, scaler = _precision(options.precision, device, setup.warn)
    preparing = time.perf_counter()
    readers = _readers(setup)
    # the option, or the datastore's own flag (MATLAB's augmentedImageDatastore DispatchInBackground)
    background = options.dispatch_in_background or getattr(setup.train_data, "dispatch_in_background", False) is True
    data = make_batch_source(setup.train_data, device, options.data_placement, background, seed=_loader_seed(setup),
                             readers=readers, progress=_progress(setup, "training data", setup.train_data),
                             warn=setup.warn)
    if isinstance(data, StreamBatches):
        closing.callback(data.close)
    validation = _Validator(setup, model, autocast_dtype) if setup.validation_data is not None else None
    prepare_seconds = time.perf_counter() - preparing

    # ---- setup: the solver, and every variant, chosen once ----------------------------------------------------
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    train_channels_last(model, device, _first_input(data, setup.seed), autocast)  # undone by layout_restored
    _autotune_convolutions(device)  # after the layout check's one-sample pass: no tuning for its shapes
    # mini_batch_size="auto" (a probe of the GPU, with the data in place) and learn_rate_scaling, settled
    setup, chosen = _settled(setup, model, data, autocast)
    options = setup.options
    if validation is not None:
        validation.split(max(setup.counts))  # a rank's training batch fits, so this does
    samples, global_batch = len(data), sum(setup.counts)
    offset, local = sum(setup.counts[: setup.rank]), setup.counts[setup.rank]
    iterations_per_epoch = max(1, samples // global_batch)  # MATLAB drops the last incomplete mini-batch
    max_epochs = int(options.max_epochs)
    total_iterations = iterations_per_epoch * max_epochs
    optimizer = make_optimizer(model, options)
    rate = learn_rate_schedule(options, iterations_per_epoch)
    net: nn.Module = model
    figures: LocalFigures | PoolFigures = LocalFigures(setup.stop_reason, _read_every(setup), _graphs(options))
    if setup.group is not None:  # several ranks with work: DDP, the figures summed with the last gradient bucket
        net, figures = _distributed(model, setup, local / global_batch)
    if options.compile:  # tried on the first batch: a network that cannot compile trains eagerly, with a warning
        first = _epoch_rows(epoch_order(options.shuffle, setup.seed, 1, samples), iterations_per_epoch,
                            global_batch, offset, local)[:1]
        trial = _trial(data, first, setup.seed, autocast, loss_fn)
        net = compiled_network(net, options.compile, trial, model, device, warn=setup.warn)
    clip = _clipping(model, optimizer, scaler, options)

    epoch, iteration = 0, 0
    history: list[IterationDone] = []
    best: dict[str, Any] = {"loss": math.inf, "iteration": 0, "state": None, "bad": 0}
    if setup.resume is not None:
        epoch, iteration, history, best = _restore(setup.resume, model, optimizer, scaler)
    if setup.is_main and options.checkpoint_path:
        prepare_folder(options.checkpoint_path)
    setup.publish(TrainingStarted(max_epochs, iterations_per_epoch, global_batch, setup.hardware, time.time(),
                                  first_iteration=iteration + 1, initial_learn_rate=float(options.initial_learn_rate),
                                  choices=chosen, prepare_seconds=prepare_seconds,
                                  data_placement=_placement(data, readers)))
    setup.publish(list(history))  # a resumed run shows its whole history

    pending: list[Pending] = []
    first_iteration = iteration + 1  # a failure of its step is the network not fitting the data (misfit_error)
    # a resumed run goes on counting time and images from where its checkpoint ended
    start = time.perf_counter() - (history[-1].time_since_start if history else 0.0)
    images, stop_reason = (history[-1].images if history else 0), None
    optimizer_rate = math.nan  # the base learn rate the optimizer's groups were last set to
    last_read = time.perf_counter()

    # ---- epochs -------------------------------------------------------------------------------------------------
    while epoch < max_epochs and stop_reason is None:
        epoch += 1
        order = epoch_order(options.shuffle, setup.seed, epoch, samples)
        rows = _epoch_rows(order, iterations_per_epoch, global_batch, offset, local)
        model.train()
        for step, (inputs, labels) in enumerate(data.epoch(rows, _epoch_seed(setup.seed, epoch)), 1):
            iteration += 1
            learn_rate = rate(iteration - 1)
            if learn_rate != optimizer_rate:
                optimizer_rate = learn_rate
                for group in optimizer.param_groups:
                    group["lr"] = learn_rate * group.get("lr_factor", 1.0)

            # the step: forward, loss, backward, clip, step
            try:
                with autocast:
                    outputs = main_output(call_model(net, inputs))
                    loss = loss_fn(outputs, labels)
            except Exception as error:
                if iteration == first_iteration and not out_of_memory(error):
                    raise misfit_error(error, inputs, labels) from error
                raise
            kept = figures.keep(loss, outputs, labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            clip()
            scaler.step(optimizer)
            scaler.update()
            images += global_batch
            pending.append(Pending(epoch, iteration, time.perf_counter() - start, learn_rate, images, kept))

            # read the figures in bunches, or when this iteration needs them (nbscale.train.figures): a read
            # reports the bunch before, and waits for its own only where this iteration needs its figures now
            due = iteration == 1 or iteration % options.validation_frequency == 0 or iteration == total_iterations
            asked = figures.stop_asked()
            now = time.perf_counter()
            needed = (asked or (validation is not None and due) or iteration == total_iterations
                      or (step == len(rows) and _checkpoint_due(options, epoch)))
            if not (len(pending) >= figures.read_every or needed or step == len(rows)
                    or now - last_read >= figures.interval):
                continue
            last_read = now
            readings, pending = figures.read(pending, asked, wait=needed), []

            # stop checks (acted on at the end of the last iteration read; a non-finite loss ends the history
            # at its iteration), then validation, then events
            for reading in readings:
                finite = math.isfinite(reading.training_loss)
                if not finite:
                    epoch, iteration, images = reading.epoch, reading.iteration, reading.images
                    stop_reason = (f"Training loss is {reading.training_loss} at iteration {iteration} "
                                   f"(epoch {epoch}): lower initial_learn_rate or set gradient_threshold.")
                    if setup.warn is not None:
                        setup.warn(stop_reason)
                elif reading.stops and stop_reason is None:
                    stop_reason = setup.stop_reason() or "Stopped on request"
                validation_loss = validation_accuracy = None
                if (reading is readings[-1] and validation is not None and (due or stop_reason is not None)
                        and finite):
                    validation_loss, validation_accuracy = validation.evaluate()
                    if validation_loss < best["loss"]:
                        best.update(loss=validation_loss, iteration=reading.iteration, bad=0)
                        if options.output_network == "best-validation":
                            best["state"] = _cpu_copy(model.state_dict())
                    else:
                        best["bad"] += 1
                        if best["bad"] >= options.validation_patience and stop_reason is None:
                            stop_reason = (f"Met validation criterion "
                                           f"(validation_patience={options.validation_patience})")
                    model.train()
                    reading.time = time.perf_counter() - start  # the iteration's time includes its validation

                event = IterationDone(reading.epoch, reading.iteration, reading.time, reading.training_loss,
                                      reading.accuracy, reading.learn_rate, reading.images, validation_loss,
                                      validation_accuracy)
                history.append(event)
                setup.publish(event)
                # a listener (output_fn, the Stop button) may have asked just now; with a later bunch trained and
                # unread, the next iteration's stop check reads that bunch too and stops
                if stop_reason is None and figures.unread is None and figures.stop_asked():
                    stop_reason = setup.stop_reason()
                if not finite:
                    break
            if stop_reason is not None:
                break

        # checkpoint (complete epochs only, so resume continues with no lost or repeated epoch)
        path = options.checkpoint_path
        if stop_reason is None and setup.is_main and path and _checkpoint_due(options, epoch):
            save_checkpoint(path, epoch, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "epoch": epoch, "iteration": iteration, "seed": setup.seed, "history": history,
                "best": best, "rng": torch.get_rng_state(), "options": _plain_options(options),
                "samples": len(setup.train_data),
            })

    # ---- the end ----------------------------------------------------------------------------------------------
    # a stop asked while an iteration's event went out (output_fn, the Stop button) ends the run after that
    # iteration, which was not validated: validate it now, so the final figures are the returned network's
    final_loss = final_accuracy = None
    if validation is not None and history and history[-1].validation_loss is None \
            and math.isfinite(history[-1].training_loss):
        final_loss, final_accuracy = validation.evaluate()
        if final_loss < best["loss"]:
            best.update(loss=final_loss, iteration=iteration, bad=0)
            if options.output_network == "best-validation":
                best["state"] = _cpu_copy(model.state_dict())
    stop_reason = stop_reason or "Max epochs completed"
    output_iteration = iteration
    if options.output_network == "best-validation" and best["state"] is not None:
        model.load_state_dict(best["state"])
        output_iteration = best["iteration"]
    elapsed = time.perf_counter() - start
    setup.publish(TrainingDone(stop_reason, epoch, iteration, elapsed, output_iteration,
                               images / elapsed if elapsed > 0 else 0.0, final_loss, final_accuracy))
    return LoopResult(stop_reason, _cpu_copy(model.state_dict()), output_iteration, iteration)


# ---- pieces the loop uses ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _cheap_garbage_collection() -> Iterator[None]:
    """Keep the garbage collector's passes short and rare while training runs; restored afterwards.

    - The objects that exist before training are frozen out of full passes: a notebook's heap (matplotlib,
      pandas, a kernel's history) is often large, and a full pass over it stalls a random iteration. A heap the
      user froze is left as it is.
    - The youngest generation is collected every YOUNG_COLLECTION_THRESHOLD new objects instead of 700: each
      iteration makes a few objects that live on (its history entry), and frequent young passes kept scanning
      them, a cost paid every iteration that shows on a small network.
    """
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_THRESHOLD), *threshold[1:])
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*threshold)


YOUNG_COLLECTION_THRESHOLD = 10_000


@contextlib.contextmanager
def _cudnn_setting_restored() -> Iterator[None]:
    benchmark = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark


def _autotune_convolutions(device: torch.device) -> None:
    """On a GPU, cuDNN times its convolution algorithms on the first batches and keeps the fastest (worth it:
    training batches keep one shape), as a hand-written loop sets `cudnn.benchmark`; left alone where the user
    asked for deterministic algorithms. Restored after training (`_cudnn_setting_restored`)."""
    if device.type == "cuda" and not torch.backends.cudnn.deterministic:
        torch.backends.cudnn.benchmark = True


def _settled(setup: LoopSetup, model: nn.Module, data: BatchSource, autocast: Any) -> tuple[LoopSetup, str]:
    """`setup` with mini_batch_size="auto" and learn_rate_scaling settled (nbscale.train.batch_fitting), and what
    was chosen and why ("" when nothing was)."""
    options, device = setup.options, setup.device
    if options.mini_batch_size != "auto" and options.learn_rate_scaling == "none":
        return setup, ""
    probe = (gpu_probe(model, data, options, setup.loss_fn, device, autocast, setup.seed) if device.type == "cuda"
             else no_probe)
    with untouched(model, device) if options.mini_batch_size == "auto" else contextlib.nullcontext():
        choices = settle(options, setup.counts, len(data), setup.resume, probe, smallest_over(setup.group, device))
    return dataclasses.replace(setup, options=choices.options, counts=choices.counts), choices.said


def _readers(setup: LoopSetup) -> Readers | None:
    """On a pool with several ranks with work: those ranks, which read the training data together (each a block
    of it, then they share what they read: nbscale.train.preparing); else None."""
    if setup.group is None:
        return None
    active = [rank for rank, count in enumerate(setup.counts) if count > 0]
    return Readers(active.index(setup.rank), len(active), setup.group, setup.device)


def _progress(setup: LoopSetup, what: str, data: Any) -> Progress:
    """Counts the items of `data` this process reads before training, told as PreparingData events: done by this
    process, of all the items (on a pool the notebook adds the ranks' counts up)."""
    unit = "files" if getattr(data, "files", None) else "items"
    whole = len(data)

    def report(done: int, total: int) -> None:
        setup.publish(PreparingData(what, done, whole, unit))

    return Progress(report)


def _placement(data: BatchSource, readers: Readers | None) -> str:
    """Where the training data are held, for the info panel (`info.data_placement`)."""
    if readers is None or not isinstance(data, StreamBatches):
        return data.description
    return f"{data.description} on each of {readers.count} workers, each reading its share of every mini-batch"


def _first_input(data: BatchSource, seed: int) -> Callable[[], torch.Tensor]:
    """The first sample's input as a batch of one, from where the data are held (no file is read again)."""
    def first() -> torch.Tensor:
        inputs, _ = next(iter(data.epoch(torch.zeros((1, 1), dtype=torch.long), seed)))
        return inputs

    return first


def _checkpoint_due(options: TrainingOptions, epoch: int) -> bool:
    """True when `epoch`'s end saves a checkpoint (every rank tells the same)."""
    return bool(options.checkpoint_path) and epoch % options.checkpoint_frequency == 0


def _read_every(setup: LoopSetup) -> int:
    """Most iterations between reads of the figures in one process (1: every iteration, for output_fn)."""
    return 1 if setup.read_each_iteration else READ_EVERY


def _graphs(options: TrainingOptions) -> bool:
    """True for torch.compile modes that replay CUDA graphs, whose outputs live only until the next replay."""
    return options.compile in ("reduce-overhead", "max-autotune")


def _distributed(model: nn.Module, setup: LoopSetup, share: float) -> tuple[nn.Module, PoolFigures]:
    """`model` in DistributedDataParallel over the ranks with work, and the figures that travel with its
    gradients (nbscale.train.figures)."""
    from torch.nn.parallel import DistributedDataParallel

    device = setup.device
    net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                  process_group=setup.group)
    hook = CarryingHook(setup.group, share)
    net.register_comm_hook(None, hook.reduce)
    return net, PoolFigures(hook, setup.group, device, setup.stop_reason, setup.read_each_iteration)


def _epoch_rows(order: torch.Tensor, iterations: int, global_batch: int, offset: int, local: int) -> torch.Tensor:
    """This rank's sample indices of each iteration of an epoch: iterations x local, from the epoch's order."""
    if len(order) < global_batch:  # fewer samples than a mini-batch (unreadable files left out): one iteration
        return order[offset: offset + local][None]
    return order[: iterations * global_batch].view(iterations, global_batch)[:, offset: offset + local]


def _loader_seed(setup: LoopSetup) -> int:
    """The seed of a DataLoader's own random stream: a rank's background processes draw other numbers than
    another rank's."""
    return (setup.seed * 1_000_003 + setup.rank) % 2**62


def _epoch_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's random augmentation: a pure function, so resume and every rank draw the same."""
    return (seed * 1_000_003 + epoch) % 2**62


def _trial(data: BatchSource, rows: torch.Tensor, seed: int, autocast: Any,
           loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[[nn.Module], None]:
    """One forward and backward of a network on the first batch (whether a network compiles shows there)."""
    def trial(candidate: nn.Module) -> None:
        inputs, labels = next(iter(data.epoch(rows, seed)))
        with autocast:
            loss = loss_fn(main_output(call_model(candidate, inputs)), labels)
        loss.backward()

    return trial


def _clipping(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
              options: TrainingOptions) -> Callable[[], None]:
    """The gradient clipping of every iteration (MATLAB's gradient_threshold), or a function doing nothing."""
    threshold, method = float(options.gradient_threshold), options.gradient_threshold_method
    if math.isinf(threshold):
        return _no_clipping

    def clip() -> None:
        scaler.unscale_(optimizer)  # clip the true gradients (does nothing without loss scaling)
        clip_gradients(model, method, threshold)

    return clip


def _no_clipping() -> None:
    pass


def epoch_order(shuffle: str, seed: int, epoch: int, samples: int) -> torch.Tensor:
    """Sample order of `epoch` (1-based): the same on every rank, and a pure function so resume is exact."""
    if shuffle == "never":
        return torch.arange(samples)
    generator = torch.Generator().manual_seed(seed + (epoch if shuffle == "every-epoch" else 0))
    return torch.randperm(samples, generator=generator)


def clip_gradients(model: nn.Module, method: str, threshold: float) -> None:
    """MATLAB's gradient clipping: per-parameter L2 norm, global L2 norm, or element-wise absolute value."""
    with_gradients = [p for p in model.parameters() if p.grad is not None]
    if not with_gradients:
        return
    if method == "global-l2norm":
        torch.nn.utils.clip_grad_norm_(with_gradients, threshold)
    elif method == "absolute-value":
        torch.nn.utils.clip_grad_value_(with_gradients, threshold)
    else:  # "l2norm": each parameter's gradient on its own (torch has no public per-tensor clip in one launch)
        grads = [p.grad for p in with_gradients if p.grad is not None]  # all are; this narrows the type
        norms = torch._foreach_norm(grads)
        factors = [torch.clamp(threshold / (n + 1e-12), max=1.0) for n in norms]
        torch._foreach_mul_(grads, factors)


class _Validator:
    """Loss and accuracy over the validation data, with the plain network in eval mode (never the compiled one:
    its last smaller batch and eval mode would compile it again); on a pool each rank takes every k-th sample,
    with the main rank's buffers (the network the user gets back: see `_take_main_ranks_buffers`)."""

    def __init__(self, setup: LoopSetup, model: nn.Module, autocast_dtype: Any) -> None:
        from nbscale.train.loading import as_dataset

        self.setup, self.model, self.autocast_dtype = setup, model, autocast_dtype
        data = as_dataset(setup.validation_data, "validation_data")
        active = sum(1 for c in setup.counts if c > 0)
        position = sum(1 for c in setup.counts[: setup.rank] if c > 0)
        # each rank reads and holds only the samples it validates
        # torch's Dataset declares no __len__; as_dataset checked it
        rows = torch.arange(position, len(data), active) if active > 1 else None  # type: ignore[arg-type]
        self.source: BatchSource | None = None
        self.batches: list[torch.Tensor] = []
        if rows is None or len(rows):
            self.source = make_batch_source(data, setup.device, setup.options.data_placement, False,
                                            seed=_loader_seed(setup), rows=rows,
                                            progress=_progress(setup, "validation data", data))

    def split(self, batch: int) -> None:
        """Validate in batches of `batch` samples (once the training's mini-batch is settled)."""
        if self.source is not None:
            self.batches = list(torch.split(torch.arange(len(self.source)), batch))

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float | None]:
        if self.setup.group is not None:
            _take_main_ranks_buffers(self.model, self.setup.group)
        self.model.eval()
        device = self.setup.device
        totals = torch.zeros(3, device=device)
        # the same augmentation draws at every validation, so its figures compare over the run
        for inputs, labels in self.source.epoch(self.batches, self.setup.seed) if self.source is not None else ():
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                outputs = main_output(call_model(self.model, inputs))
                loss = self.setup.loss_fn(outputs, labels)
            count = batch_length(labels)
            totals[0] += loss.float() * count
            totals[1] += correct(outputs, labels, device)
            totals[2] += count
        if self.setup.group is not None:
            torch.distributed.all_reduce(totals, group=self.setup.group)
        loss_sum, correct_count, count = totals.tolist()
        count = max(count, 1)
        return loss_sum / count, (correct_count / count if correct_count >= 0 else None)


def _take_main_ranks_buffers(model: nn.Module, group: Any) -> None:
    """Every rank's buffers (BatchNorm's running statistics) become the main rank's, in place.

    Each rank's running statistics follow its own share of the data, while the network returned (and written to
    checkpoints) is the main rank's: validating with these makes the figures those of the returned network.
    Training is unchanged, since DistributedDataParallel itself broadcasts the main rank's buffers at the start of
    every forward pass (broadcast_buffers).
    """
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, group=group, group_src=0)  # the group's rank 0 is the main rank


def _precision(precision: str, device: torch.device,
               warn: Callable[[str], None] | None) -> tuple[torch.dtype | None, torch.amp.GradScaler]:
    """(autocast dtype or None, GradScaler): bf16 where the GPU has it, else fp16 with loss scaling; the scaler
    is enabled only for fp16 (disabled, it passes the loss and the step through, as in nanoGPT)."""
    if precision == "mixed" and device.type != "cuda" and warn is not None:
        warn("precision='mixed' only speeds up GPUs; training on the CPU in single precision.")
    if precision != "mixed" or device.type != "cuda":
        return None, torch.amp.GradScaler(device.type, enabled=False)
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, torch.amp.GradScaler("cuda", enabled=False)
    return torch.float16, torch.amp.GradScaler("cuda")


def _restore(state: dict[str, Any], model: nn.Module, optimizer: Any,
             scaler: torch.amp.GradScaler) -> tuple[int, int, list[IterationDone], dict[str, Any]]:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return state["epoch"], state["iteration"], list(state["history"]), dict(state["best"])


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def _plain_options(options: TrainingOptions) -> dict[str, Any]:
    return {k: v for k, v in options.to_dict().items() if k not in ("validation_data", "output_fn")}

