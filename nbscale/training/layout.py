"""The memory layout a network trains in: channels_last for networks with convolutions, on GPUs and CPUs.

GPU tensor cores (bf16, fp16 and TF32) and the CPU's oneDNN convolve NHWC data fastest; a network in the default
NCHW layout pays for a transpose around every convolution (BENCHMARKS.md measures both). A network that cannot
run in channels_last (a `.view` of a convolution's output, say) is found by one forward pass on one sample before
training and trains in NCHW as before; after training the weights go back to NCHW. A network the user put in
channels_last is left so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from nbscale.data.batches import call_model, to_device


def train_channels_last(
    model: nn.Module,
    device: torch.device,
    first_input: Callable[[], torch.Tensor],
    autocast: contextlib.AbstractContextManager[object],
) -> None:
    """Put a network with convolutions in channels_last where it runs so (tried on `first_input()`, a batch of
    one sample); `layout_restored` puts it back."""
    if not _in_nchw(model):
        return
    model.to(memory_format=torch.channels_last)
    if not _runs_on(model, first_input, device, autocast):
        model.to(memory_format=torch.contiguous_format)


@contextlib.contextmanager
def layout_restored(model: nn.Module) -> Iterator[None]:
    """Give the network back in NCHW where it came in so (when training ends or fails): code in the notebook may
    `.view` its weights."""
    came_in_nchw = _in_nchw(model)
    try:
        yield
    finally:
        if came_in_nchw and not _in_nchw(model):
            model.to(memory_format=torch.contiguous_format)


def _in_nchw(model: nn.Module) -> bool:
    """True for a network with convolution weights (4-D), all in the default layout."""
    weights = [p for p in model.parameters() if p.dim() == 4]
    return bool(weights) and all(p.is_contiguous() for p in weights)


def _runs_on(
    model: nn.Module,
    first_input: Callable[[], torch.Tensor],
    device: torch.device,
    autocast: contextlib.AbstractContextManager[object],
) -> bool:
    """True when a forward pass on the first sample works (in eval mode and without gradients: no state
    changes)."""
    was_training = model.training
    model.eval()
    try:
        inputs = to_device(first_input(), device)
        with torch.no_grad(), autocast:
            call_model(model, inputs)
        return True
    except Exception:  # not this layout, or not a tensor input: train as before, where any real error shows
        return False
    finally:
        model.train(was_training)
