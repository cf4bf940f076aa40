"""Running out of GPU memory leaves nothing of the run behind (nbscale.training.out_of_memory), shown on the CPU: a
loss function raises torch.OutOfMemoryError as the caching allocator would, while it holds a large tensor."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

import nbscale
from nbscale.training.out_of_memory import released_on_out_of_memory

HELD: list[weakref.ref] = []  # weak references to the tensors each failing run held


def _run_holding_a_tensor() -> None:
    held = torch.ones(1 << 20)  # what a run's frames hold: a batch, activations
    HELD.append(weakref.ref(held))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_the_reproduction_re_raising_from_none_inside_the_handler_keeps_the_runs_tensor():
    HELD.clear()
    with pytest.raises(RuntimeError) as caught:
        try:
            _run_holding_a_tensor()
        except torch.OutOfMemoryError:
            raise RuntimeError("out of memory") from None  # what nbscale did: the original stays as __context__
    assert caught.value.__context__ is not None and HELD[0]() is not None


def test_an_out_of_memory_error_reaches_the_caller_holding_none_of_the_runs_frames():
    HELD.clear()
    with pytest.raises(torch.OutOfMemoryError, match="nbscale's words") as caught:
        released_on_out_of_memory(_run_holding_a_tensor, lambda error: f"nbscale's words ({error})")
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert "Tried to allocate 2.00 GiB" in str(caught.value)  # torch's own text is kept, as text
    assert HELD[0]() is None  # freed by reference counting alone, before any collection


class OutOfMemoryOnSecondStep(nn.Module):
    """A loss that runs out of memory on its second call, holding a large tensor when it does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= 2:
            _run_holding_a_tensor()
        return nn.functional.cross_entropy(outputs, labels)


def test_training_in_the_notebook_that_runs_out_of_memory_raises_torchs_type_naming_the_batch_and_holds_nothing():
    HELD.clear()
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    options = nbscale.TrainingOptions(
        "sgdm", mini_batch_size=16, max_epochs=1, plots="none", verbose=False, execution_environment="cpu"
    )
    with pytest.raises(torch.OutOfMemoryError) as caught:
        nbscale.train(nn.Linear(4, 2), data, options, loss_fn=OutOfMemoryOnSecondStep())
    assert "Out of GPU memory training on CPU" in str(caught.value) and "mini_batch_size=16" in str(caught.value)
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert HELD and HELD[-1]() is None
