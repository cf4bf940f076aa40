"""The training loop, the same in the notebook's process and on every pool worker.

Reads top to bottom: setup (data, optimizer, schedule, resume), then per epoch, per iteration (forward,
backward, clip, step, metrics, events, stop checks), validation, checkpoint. On a pool each rank trains on its
share of every global mini-batch and gradients are averaged by DistributedDataParallel over the ranks that
have work; the loss of rank r is weighted by its share so the update equals the single-process one.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbscale.outputs import main_output
from nbscale.train.checkpoint import prepare_folder, save_checkpoint
from nbscale.train.events import IterationDone, TrainingDone, TrainingStarted
from nbscale.train.layout import layout_restored, train_channels_last
from nbscale.train.loading import make_batch_source
from nbscale.train.options import TrainingOptions
from nbscale.train.schedules import learn_rate_schedule


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
    group: Any = None  # torch.distributed group of the ranks with work; None in-process
    is_main: bool = True  # writes checkpoints
    read_each_iteration: bool = False  # a listener needs every iteration's figures at once (output_fn)


@dataclass
class LoopResult:
    stop_reason: str
    state_dict: dict[str, torch.Tensor]
    output_network_iteration: int
    iteration: int


def run_training(setup: LoopSetup) -> LoopResult:
    """Train `setup.model` in place; returns the output network's state and why training ended."""
    with _cheap_garbage_collection(), layout_restored(setup.model):
        return _train(setup)


def _train(setup: LoopSetup) -> LoopResult:
    options, device = setup.options, setup.device
    distributed = setup.group is not None

    # ---- setup ------------------------------------------------------------------------------------------------
    model = setup.model.to(device)
    global_batch = sum(setup.counts)
    offset, local = sum(setup.counts[: setup.rank]), setup.counts[setup.rank]
    active = sum(1 for c in setup.counts if c > 0)
    samples = len(setup.train_data)
    iterations_per_epoch = max(1, samples // global_batch)  # MATLAB drops the last incomplete mini-batch
    max_epochs = int(options.max_epochs)
    total_iterations = iterations_per_epoch * max_epochs
    source = make_batch_source(setup.train_data, device, options.data_placement, options.dispatch_in_background)
    optimizer = make_optimizer(model, options)
    rate = learn_rate_schedule(options, iterations_per_epoch)
    autocast_dtype, scaler = _precision(options.precision, device)
    # one context for every iteration (entered once each, never nested)
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    train_channels_last(model, device, autocast_dtype, setup.train_data, autocast)  # layout_restored undoes it
    clipping = not math.isinf(options.gradient_threshold)
    net: nn.Module = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                      process_group=setup.group)
        reducer = _MetricsWithGradients(setup.group)
        net.register_comm_hook(None, reducer.hook)
    # the loss of this rank is scaled so DDP's mean over `active` ranks is the mean over the global batch
    loss_weight = local * active / global_batch

    epoch, iteration, history = 0, 0, []
    best = {"loss": math.inf, "iteration": 0, "state": None, "bad": 0}
    if setup.resume is not None:
        epoch, iteration, history, best = _restore(setup.resume, model, optimizer, scaler)
    if setup.is_main and options.checkpoint_path:
        prepare_folder(options.checkpoint_path)
    setup.publish(TrainingStarted(max_epochs, iterations_per_epoch, global_batch, setup.hardware, time.time(),
                                  first_iteration=iteration + 1))
    setup.publish(list(history))  # a resumed run shows its whole history

    validation = _Validator(setup, model, autocast_dtype, active) if setup.validation_data is not None else None
    # Per-iteration figures stay where they are until read, and are read in bunches (every READ_INTERVAL
    # seconds, at most READ_EVERY iterations): on a GPU a read waits for the GPU, and in one process the
    # accuracy of a bunch is one computation instead of one per iteration. On a CPU pool every iteration is
    # read; on a GPU pool every READ_EVERY iterations, the same on every rank. Figures are also read whenever
    # an iteration needs them: validation, a stop request, the end of an epoch, or setup.read_each_iteration.
    read_every = _read_every(device, setup)
    pending: list[_Pending] = []
    one = torch.ones((), device=device)
    # a resumed run goes on counting time and images from where its checkpoint ended
    start = time.perf_counter() - (history[-1].time_since_start if history else 0.0)
    images, stop_reason = (history[-1].images if history else 0), None
    optimizer_rate = math.nan  # the base learn rate the optimizer's groups were last set to
    last_read = time.perf_counter()

    # ---- epochs -------------------------------------------------------------------------------------------------
    while epoch < max_epochs and stop_reason is None:
        epoch += 1
        order = epoch_order(options.shuffle, setup.seed, epoch, samples)
        mine = [order[i * global_batch + offset: i * global_batch + offset + local]
                for i in range(iterations_per_epoch)]
        model.train()
        for step, (inputs, labels) in enumerate(source.epoch(mine), 1):
            iteration += 1
            learn_rate = rate(iteration - 1)
            if learn_rate != optimizer_rate:
                optimizer_rate = learn_rate
                for group in optimizer.param_groups:
                    group["lr"] = learn_rate * group.get("lr_factor", 1.0)

            # forward, backward, clip, step
            with autocast:
                outputs = main_output(net(inputs))
                loss = setup.loss_fn(outputs, labels)
            if distributed:  # summed over the ranks together with the last gradient bucket
                with torch.no_grad():
                    stop_flag = 1.0 if setup.stop_reason() else 0.0
                    reducer.metrics = torch.stack([loss.detach().float() * len(labels),
                                                   _correct(outputs, labels, device).float(), one * len(labels),
                                                   one * stop_flag])
            optimizer.zero_grad(set_to_none=True)
            backward_loss = loss * loss_weight if distributed else loss
            if scaler is not None:
                scaler.scale(backward_loss).backward()
                scaler.unscale_(optimizer)
            else:
                backward_loss.backward()
            if clipping:
                clip_gradients(model, options.gradient_threshold_method, options.gradient_threshold)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            images += global_batch
            if distributed:
                figures = reducer.take(setup.group)
            else:  # the accuracy is worked out when read, for the whole bunch at once
                figures = (loss, outputs, labels)
            pending.append(_Pending(epoch, iteration, time.perf_counter() - start, learn_rate, images, figures))

            # read the figures when this iteration needs them (see read_every above)
            due = iteration == 1 or iteration % options.validation_frequency == 0 or iteration == total_iterations
            asked = not distributed and setup.stop_reason() is not None
            now = time.perf_counter()
            if not (len(pending) >= read_every or asked or (validation is not None and due)
                    or step == len(mine)  # the epoch's last: checkpoints need the figures
                    or (not distributed and now - last_read >= READ_INTERVAL)):
                continue
            last_read = now
            readings, pending = _read(pending, distributed), []
            if not distributed:
                readings[-1].stops = asked

            # stop checks (acted on at the end of the last iteration read; a non-finite loss ends the history
            # at its iteration), then validation, then events
            for reading in readings:
                finite = math.isfinite(reading.training_loss)
                if not finite:
                    epoch, iteration, images = reading.epoch, reading.iteration, reading.images
                    stop_reason = (f"Training loss is {reading.training_loss} at iteration {iteration} "
                                   f"(epoch {epoch}): lower initial_learn_rate or set gradient_threshold.")
                    warnings.warn(stop_reason, RuntimeWarning, stacklevel=2)
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
                if stop_reason is None and not distributed:  # a listener (output_fn) may have asked just now
                    stop_reason = setup.stop_reason()
                if not finite:
                    break
            if stop_reason is not None:
                break

        # checkpoint (complete epochs only, so resume continues with no lost or repeated epoch)
        if (stop_reason is None and setup.is_main and options.checkpoint_path
                and epoch % options.checkpoint_frequency == 0):
            save_checkpoint(options.checkpoint_path, epoch, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "epoch": epoch, "iteration": iteration, "seed": setup.seed, "history": history,
                "best": best, "rng": torch.get_rng_state(), "options": _plain_options(options), "samples": samples,
            })

    # ---- the end ----------------------------------------------------------------------------------------------
    stop_reason = stop_reason or "Max epochs completed"
    output_iteration = iteration
    if options.output_network == "best-validation" and best["state"] is not None:
        model.load_state_dict(best["state"])
        output_iteration = best["iteration"]
    elapsed = time.perf_counter() - start
    setup.publish(TrainingDone(stop_reason, epoch, iteration, elapsed, output_iteration,
                               images / elapsed if elapsed > 0 else 0.0))
    return LoopResult(stop_reason, _cpu_copy(model.state_dict()), output_iteration, iteration)


# ---- pieces the loop uses ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _cheap_garbage_collection() -> Iterator[None]:
    """Keep the garbage collector's passes short and rare while training runs; restored afterwards.

    - The objects that exist before training are frozen out of full passes: a notebook's heap (matplotlib,
      pandas, a kernel's history) is often half a million objects, and a full pass over them took ~0.2 s at a
      random iteration. A heap the user froze is left as it is.
    - The youngest generation is collected every YOUNG_COLLECTION_THRESHOLD new objects instead of 700: each
      iteration makes a few objects that live on (its history entry), and frequent young passes kept scanning
      them (~4 us an iteration, ~1% of a small network's iteration on a CPU).
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


READ_EVERY = 25  # most iterations between reads of the figures, except on a CPU pool (see run_training)
READ_INTERVAL = 0.2  # seconds between reads in the notebook's process, so the display stays live


def _read_every(device: torch.device, setup: LoopSetup) -> int:
    """Iterations between reads of the training figures (1: every iteration)."""
    distributed_on_cpu = setup.group is not None and device.type == "cpu"
    return 1 if distributed_on_cpu or setup.read_each_iteration else READ_EVERY


@dataclass
class _Pending:
    """An iteration whose figures may still be on the device."""

    epoch: int
    iteration: int
    time: float
    learn_rate: float
    images: int
    figures: Any  # (loss, outputs, labels) in one process (see _bunch_accuracy); on a pool [loss sum, correct,
    # count, stops] summed over the ranks


@dataclass
class _Reading:
    epoch: int
    iteration: int
    time: float
    learn_rate: float
    images: int
    training_loss: float
    accuracy: float | None
    stops: bool


@torch.no_grad()  # in one process the figures are the iterations' loss and outputs, not detached
def _read(pending: list[_Pending], distributed: bool) -> list[_Reading]:
    """The figures of the pending iterations, read from the device at once (one wait for a GPU)."""
    if distributed:
        rows = (torch.stack([p.figures for p in pending]) if len(pending) > 1 else pending[0].figures[None]).tolist()
    else:
        losses = torch.stack([p.figures[0].float() for p in pending])
        rows = torch.stack([losses, _bunch_accuracy([p.figures[1:] for p in pending], losses.device)], 1).tolist()
    readings = []
    for p, row in zip(pending, rows, strict=True):
        if distributed:
            loss_sum, correct, count, stops = row
        else:
            (loss_sum, correct), count, stops = row, 1, 0.0  # the mean loss and the accuracy already
        readings.append(_Reading(p.epoch, p.iteration, p.time, p.learn_rate, p.images, loss_sum / count,
                                 correct / count if correct >= 0 else None, stops > 0))
    return readings


class _MetricsWithGradients:
    """DDP communication hook: averages gradient buckets like DDP's own all-reduce, and sums the iteration's
    figures (`metrics`) with the last bucket, so a pool iteration needs one collective, not two."""

    def __init__(self, group: Any) -> None:
        self.group, self.metrics, self.reduced = group, None, None

    def hook(self, state, bucket):  # noqa: ANN001, ANN201 - DDP rejects annotations other than its own
        gradients = bucket.buffer()
        gradients.div_(torch.distributed.get_world_size(self.group))
        carry = self.metrics is not None and bucket.is_last() and gradients.dtype == torch.float32
        size = gradients.numel()
        tensor = torch.cat([gradients, self.metrics]) if carry else gradients
        if carry:
            self.metrics = None

        def done(future: Any) -> torch.Tensor:
            reduced = future.value()[0]
            if not carry:
                return reduced
            self.reduced = reduced[size:]
            return reduced[:size]

        future = torch.distributed.all_reduce(tensor, group=self.group, async_op=True).get_future()
        return future.then(done)

    def take(self, group: Any) -> torch.Tensor:
        """This iteration's summed figures (an all-reduce of their own when no bucket could carry them)."""
        reduced, self.reduced = self.reduced, None
        if reduced is None:
            reduced, self.metrics = self.metrics, None
            torch.distributed.all_reduce(reduced, group=group)
        return reduced


def epoch_order(shuffle: str, seed: int, epoch: int, samples: int) -> torch.Tensor:
    """Sample order of `epoch` (1-based): the same on every rank, and a pure function so resume is exact."""
    if shuffle == "never":
        return torch.arange(samples)
    generator = torch.Generator().manual_seed(seed + (epoch if shuffle == "every-epoch" else 0))
    return torch.randperm(samples, generator=generator)


def make_optimizer(model: nn.Module, options: TrainingOptions) -> torch.optim.Optimizer:
    """The solver over the model's trainable parameters; biases get no L2 (MATLAB's BiasL2Factor 0).

    Per-layer learn-rate factors and frozen layers come from nbscale.models.learn_rates when it is present.
    """
    base = float(options.initial_learn_rate)
    try:
        from nbscale.models.learn_rates import param_groups

        groups = param_groups(model, base)
    except ImportError:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": base}]
    names = {id(p): name for name, p in model.named_parameters()}
    l2 = float(options.l2_regularization)
    split: list[dict[str, Any]] = []
    for group in groups:
        params = [p for p in group["params"] if p.requires_grad]
        factor = float(group.get("lr", base)) / base
        is_bias = [names.get(id(p), "").endswith("bias") for p in params]
        parts = ((0.0, params),) if l2 == 0 else ((l2, [p for p, b in zip(params, is_bias, strict=True) if not b]),
                                                  (0.0, [p for p, b in zip(params, is_bias, strict=True) if b]))
        for decay, chosen in parts:
            if chosen:
                split.append({"params": chosen, "lr": base * factor, "lr_factor": factor, "weight_decay": decay})
    if not split:
        from nbscale.errors import OptionsError

        raise OptionsError("The model has no trainable parameters (all frozen?): unfreeze a layer to train.")
    solver = options.solver
    if solver == "sgdm":
        return torch.optim.SGD(split, lr=base, momentum=float(options.momentum))
    betas = (float(options.gradient_decay_factor), float(options.squared_gradient_decay_factor))
    if solver == "adam":
        return torch.optim.Adam(split, lr=base, betas=betas, eps=float(options.epsilon))
    if solver == "adamw":
        return torch.optim.AdamW(split, lr=base, betas=betas, eps=float(options.epsilon))
    return torch.optim.RMSprop(split, lr=base, alpha=float(options.squared_gradient_decay_factor),
                               eps=float(options.epsilon))


def clip_gradients(model: nn.Module, method: str, threshold: float) -> None:
    """MATLAB's gradient clipping: per-parameter L2 norm, global L2 norm, or element-wise absolute value."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    if method == "global-l2norm":
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], threshold)
    elif method == "absolute-value":
        torch._foreach_clamp_min_(grads, -threshold)
        torch._foreach_clamp_max_(grads, threshold)
    else:  # "l2norm": each parameter's gradient on its own
        norms = torch._foreach_norm(grads)
        factors = [torch.clamp(threshold / (n + 1e-12), max=1.0) for n in norms]
        torch._foreach_mul_(grads, factors)


class _Validator:
    """Loss and accuracy over the validation data; on a pool each rank takes every k-th sample."""

    def __init__(self, setup: LoopSetup, model: nn.Module, autocast_dtype: Any, active: int) -> None:
        from nbscale.train.loading import as_dataset

        self.setup, self.model, self.autocast_dtype = setup, model, autocast_dtype
        data = as_dataset(setup.validation_data, "validation_data")
        position = sum(1 for c in setup.counts[: setup.rank] if c > 0)
        indices = torch.arange(position, len(data), active)
        size = int(setup.options.mini_batch_size)
        self.batches = list(torch.split(indices, size))
        self.source = make_batch_source(data, setup.device, setup.options.data_placement, False)

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float | None]:
        self.model.eval()
        totals = torch.zeros(3, device=self.setup.device)
        device_type = self.setup.device.type
        for inputs, labels in self.source.epoch(self.batches):
            with torch.autocast(device_type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                outputs = main_output(self.model(inputs))
                loss = self.setup.loss_fn(outputs, labels)
            totals[0] += loss.float() * len(labels)
            totals[1] += _correct(outputs, labels, self.setup.device)
            totals[2] += len(labels)
        if self.setup.group is not None:
            torch.distributed.all_reduce(totals, group=self.setup.group)
        loss_sum, correct, count = totals.tolist()
        count = max(count, 1)
        return loss_sum / count, (correct / count if correct >= 0 else None)


def _are_class_scores(outputs: Any, labels: Any) -> bool:
    """N x C scores for N integer labels: the case where an accuracy means something."""
    return (isinstance(outputs, torch.Tensor) and isinstance(labels, torch.Tensor) and outputs.ndim == 2
            and labels.ndim == 1 and not labels.is_floating_point())


def _bunch_accuracy(scores: list[tuple[Any, Any]], device: torch.device) -> torch.Tensor:
    """Accuracy (fraction correct) of each iteration's (outputs, labels) in a bunch, negative where they are
    not class scores."""
    if all(_are_class_scores(o, y) for o, y in scores) and len({o.shape for o, _ in scores}) == 1:
        outputs, labels = torch.stack([o for o, _ in scores]), torch.stack([y for _, y in scores])
        return (outputs.argmax(2) == labels).float().mean(1)
    return torch.stack([_correct(o, y, device).float() / max(len(y), 1) for o, y in scores])


def _correct(outputs: Any, labels: Any, device: torch.device) -> torch.Tensor:
    """Correct predictions in the batch, or -1e9 (so the sum stays negative) when outputs are not class scores."""
    if _are_class_scores(outputs, labels):
        return (outputs.argmax(1) == labels).sum()  # an integer tensor; callers convert where they sum
    return torch.full((), -1e9, device=device)


def _precision(precision: str, device: torch.device) -> tuple[Any, Any]:
    """(autocast dtype or None, GradScaler or None): bf16 where the GPU has it, else fp16 with loss scaling."""
    if precision != "mixed":
        return None, None
    if device.type != "cuda":
        warnings.warn("precision='mixed' only speeds up GPUs; training on the CPU in single precision.",
                      RuntimeWarning, stacklevel=3)
        return None, None
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def _restore(state: dict[str, Any], model: nn.Module, optimizer: Any, scaler: Any) -> tuple[int, int, list, dict]:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    return state["epoch"], state["iteration"], list(state["history"]), dict(state["best"])


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def _plain_options(options: TrainingOptions) -> dict[str, Any]:
    return {k: v for k, v in options.to_dict().items() if k not in ("validation_data", "output_fn")}

