"""TrainingOptions(compile=...): the network trains compiled by torch.compile, or eagerly where it cannot compile.

The compiled network is a wrapper that shares the user's parameters, so training updates the user's module in
place and the user gets the plain module back, never an OptimizedModule. Only the training step runs compiled:
training batches all have one shape (nbscale drops the last incomplete mini-batch of data it batches; a
DataLoader's last partial batch, unless drop_last, compiles once more), so it compiles once, with static shapes;
validation runs the plain module in eval mode, so neither its mode nor a last smaller validation
batch makes it compile again.

torch.compile compiles at the first call, so whether a network compiles is only known then. Setup tries one
forward and backward on the first batch (random number generators, BatchNorm statistics and gradients are put
back afterwards); where that fails and the same trial passes eagerly, the network trains eagerly and one warning
names the error. Where the eager trial fails too, the error is the network's or the data's, and is raised as is.

While it compiles, two notes torch logs (or, before torch 2.6, prints) that a user can do nothing about are
dropped (each by its logger and the start of its text, so every other line torch logs still shows): a CUDA build of
torch on a machine without a GPU ("No CUDA runtime is found, using CUDA_HOME=..."), and the profiler ranges
(DistributedDataParallel's) that compiled code skips ("Profiler record function ... will be ignored", once on every
pool worker).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Literal, cast

import torch
from torch import nn

from nbscale.training.options import CompileMode

Trial = Callable[[nn.Module], None]  # one forward and backward of a candidate network on a batch

# logger -> the start of the note it logs while compiling that says nothing a user can act on
_UNACTIONABLE_NOTES = {
    "torch.utils.cpp_extension": "No CUDA runtime is found",
    "torch._dynamo.variables.ctx_manager": "Profiler record function",
    "torch._dynamo.variables.torch": "Profiler function",
}


def compiled_network(
    net: nn.Module,
    mode: Literal[True] | CompileMode,
    trial: Trial,
    model: nn.Module,
    device: torch.device,
    warn: Callable[[str], None] | None,
) -> nn.Module:
    """`net` compiled in `mode` (True: torch.compile's default) where that works, else `net` itself.

    `trial` runs the candidate once (see the module docstring); `model` is the module whose buffers the trial
    must leave as they were; `warn` tells the user (None: this process does not, as a pool's other ranks).
    """
    # a module in, an OptimizedModule (an nn.Module) out
    compiled = cast(nn.Module, torch.compile(net, mode=None if mode is True else mode, dynamic=False))
    try:
        with _untouched(model, device), _unactionable_notes_dropped():
            trial(compiled)  # compiles, and so logs what it logs, here (torch logs each note once per process)
        return compiled
    except Exception as error:  # whatever compiling raises, the eager trial below tells
        failure = error
    with _untouched(model, device):
        trial(net)  # an error of the network or the data fails here too, and is raised as it is
    if warn is not None:
        # the first line that says what failed: torch 2.5 opens with "backend='inductor' raised:" alone
        lines = [line for line in str(failure).strip().splitlines() if not line.rstrip().endswith(" raised:")]
        first_line = (lines or [""])[0][:300]
        warn(
            f"compile={mode!r}: the network could not be compiled ({type(failure).__name__}: {first_line}); it "
            "trains without compiling."
        )
    return net


class _NoteDropped(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.start))


@contextlib.contextmanager
def _unactionable_notes_dropped() -> Iterator[None]:
    """A block in which torch's loggers drop the notes of _UNACTIONABLE_NOTES, and only those."""
    dropped = [(logging.getLogger(name), _NoteDropped(start)) for name, start in _UNACTIONABLE_NOTES.items()]
    for logger, note in dropped:
        logger.addFilter(note)
    try:
        _import_cpp_extension_without_its_note()
        yield
    finally:
        for logger, note in dropped:
            logger.removeFilter(note)


def _import_cpp_extension_without_its_note() -> None:
    """Import torch.utils.cpp_extension (compiling does) with its CUDA note dropped: torch before 2.6 prints it to
    stderr when it is imported rather than logging it. Every other line it prints still shows."""
    name = "torch.utils.cpp_extension"
    if name in sys.modules:
        return
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        importlib.import_module(name)
    for line in printed.getvalue().splitlines(keepends=True):
        if not line.startswith(_UNACTIONABLE_NOTES[name]):
            sys.stderr.write(line)


@contextlib.contextmanager
def _untouched(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Random number generators, buffers (BatchNorm statistics) and gradients as they were before the block."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            yield
    finally:
        for name, buffer in model.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])
        for parameter in model.parameters():
            parameter.grad = None
