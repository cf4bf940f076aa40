"""TrainingOptions(compile=...): the network trains compiled by torch.compile, or eagerly where it cannot compile.

The compiled network is a wrapper that shares the user's parameters, so training updates the user's module in
place and the user gets the plain module back, never an OptimizedModule. Only the training step runs compiled:
training batches all have one shape (the last incomplete mini-batch is dropped), so it compiles once, with
static shapes; validation runs the plain module in eval mode, so neither its mode nor a last smaller validation
batch makes it compile again.

torch.compile compiles at the first call, so whether a network compiles is only known then. Setup tries one
forward and backward on the first batch (random number generators, BatchNorm statistics and gradients are put
back afterwards); where that fails and the same trial passes eagerly, the network trains eagerly and one warning
names the error. Where the eager trial fails too, the error is the network's or the data's, and is raised as is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal, cast

import torch
from torch import nn

from nbscale.train.options import CompileMode

Trial = Callable[[nn.Module], None]  # one forward and backward of a candidate network on a batch


def compiled_network(net: nn.Module, mode: Literal[True] | CompileMode, trial: Trial, model: nn.Module,
                     device: torch.device, warn: Callable[[str], None] | None) -> nn.Module:
    """`net` compiled in `mode` (True: torch.compile's default) where that works, else `net` itself.

    `trial` runs the candidate once (see the module docstring); `model` is the module whose buffers the trial
    must leave as they were; `warn` tells the user (None: this process does not, as a pool's other ranks).
    """
    # a module in, an OptimizedModule (an nn.Module) out
    compiled = cast(nn.Module, torch.compile(net, mode=None if mode is True else mode, dynamic=False))
    try:
        with _untouched(model, device):
            trial(compiled)
        return compiled
    except Exception as error:  # noqa: BLE001 - whatever compiling raises, the eager trial below tells
        failure = error
    with _untouched(model, device):
        trial(net)  # an error of the network or the data fails here too, and is raised as it is
    if warn is not None:
        first_line = (str(failure).strip().splitlines() or [""])[0][:300]
        warn(f"compile={mode!r}: the network could not be compiled ({type(failure).__name__}: {first_line}); it "
             "trains without compiling.")
    return net


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
