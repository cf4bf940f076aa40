"""The training data read and held where training runs, before the clock starts, with their precision and seeds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nbscale.data.loading import BatchSource, make_batch_source
from nbscale.data.preparing import Readers
from nbscale.data.streaming import StreamBatches
from nbscale.training.loop_setup import LoopSetup
from nbscale.training.reading_progress import loader_seed, progress
from nbscale.training.validator import Validator


def held_data(
    setup: LoopSetup, model: nn.Module, closing: contextlib.ExitStack
) -> tuple[BatchSource, Validator | None, Any, torch.amp.GradScaler, dict[str, Any]]:
    """The data, read and held where training runs (on a pool each rank reads a block and they share them), before
    the clock starts (info.prepare_seconds, not training time): (training batches, validator, autocast dtype,
    scaler, what TrainingStarted says of them)."""
    rules = setup.plan.placement
    autocast_dtype, scaler = precision(rules.precision, setup.device, setup.warn)  # the scaler scales fp16 losses
    preparing = time.perf_counter()
    readers = readers_of(setup)
    # the option, or the datastore's own flag (MATLAB's augmentedImageDatastore DispatchInBackground)
    background = rules.dispatch_in_background or getattr(setup.train_data, "dispatch_in_background", False) is True
    data = make_batch_source(
        setup.train_data,
        setup.device,
        rules.data_placement,
        background,
        seed=loader_seed(setup),
        readers=readers,
        progress=progress(setup, "training data", setup.train_data),
        warn=setup.warn,
    )
    if isinstance(data, StreamBatches):
        closing.callback(data.close)
    validation = Validator(setup, model, autocast_dtype) if setup.validation_data is not None else None
    started = {"prepare_seconds": time.perf_counter() - preparing, "data_placement": placement(data, readers)}
    return data, validation, autocast_dtype, scaler, started


def readers_of(setup: LoopSetup) -> Readers | None:
    """On a pool with several ranks with work: those ranks, which read the training data together (each a block
    of it, then they share what they read: nbscale.data.preparing); else None."""
    if setup.group is None:
        return None
    active = [rank for rank, count in enumerate(setup.counts) if count > 0]
    return Readers(active.index(setup.rank), len(active), setup.group, setup.device)


def placement(data: BatchSource, readers: Readers | None) -> str:
    """Where the training data are held, for the info panel (`info.data_placement`)."""
    if readers is None or not isinstance(data, StreamBatches):
        return data.description
    return f"{data.description} on each of {readers.count} workers, each reading its share of every mini-batch"


def first_input(data: BatchSource, seed: int) -> Callable[[], torch.Tensor]:
    """The first sample's input as a batch of one, from where the data are held (no file is read again)."""

    def first() -> torch.Tensor:
        inputs, _ = next(iter(data.epoch(torch.zeros((1, 1), dtype=torch.long), seed)))
        return inputs

    return first


def precision(
    precision: str, device: torch.device, warn: Callable[[str], None] | None
) -> tuple[torch.dtype | None, torch.amp.GradScaler]:
    """(autocast dtype or None, GradScaler): bf16 where the GPU has it, else fp16 with loss scaling; the scaler
    is enabled only for fp16 (disabled, it passes the loss and the step through, as in nanoGPT)."""
    if precision == "mixed" and device.type != "cuda" and warn is not None:
        warn("precision='mixed' only speeds up GPUs; training on the CPU in single precision.")
    if precision != "mixed" or device.type != "cuda":
        return None, torch.amp.GradScaler(device.type, enabled=False)
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, torch.amp.GradScaler("cuda", enabled=False)
    return torch.float16, torch.amp.GradScaler("cuda")
