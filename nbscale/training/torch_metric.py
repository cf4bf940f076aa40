"""A torchmetrics Metric as a sum-reducible metric state (one of the kinds of nbscale.training.metric_kinds).

Only Metrics whose states are all tensors reduced by a sum qualify: a batch's state is then its states after
`update` from their defaults, flattened, and the sum of such states over batches and ranks is the state of all of
them, which `compute` turns into the value. A Metric keeping a list of every prediction ("cat") or a min/max
is refused with the fix.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch

from nbscale.errors import OptionsError
from nbscale.training.metric_kinds import Batch, described, fail


class TorchMetric:
    """A torchmetrics Metric whose states are all tensors reduced by a sum: a batch's state is its states after
    `update` from their defaults, flattened; a value is `compute` on a host copy holding the summed states.
    Copies are used, so the user's Metric is never changed; they never synchronise across ranks themselves
    (their update and compute are called unwrapped), since the summed state already covers every rank."""

    goal: str | None
    needs_classes = False

    def __init__(self, name: str, metric: Any) -> None:
        from torchmetrics.utilities.data import dim_zero_sum

        self.name = name
        refused = [
            state
            for state, reduce in metric._reductions.items()
            if reduce is not dim_zero_sum or not isinstance(metric._defaults[state], torch.Tensor)
        ]
        if refused or not metric._defaults:
            what = f"keeps state {refused[0]!r} that is not a sum" if refused else "has no states"
            raise fail(
                f"the torchmetrics metric {name!r} ({type(metric).__name__}) {what} (e.g. a list of every "
                "prediction), so it cannot be summed over batches and ranks. Use a version with summable states "
                "(e.g. thresholds=200 for AUROC and average-precision metrics), or a callable (outputs, targets) "
                "-> value per sample."
            )
        self.host = copy.deepcopy(metric).cpu()
        self.shapes = {state: default.shape for state, default in self.host._defaults.items()}
        self.dtypes = {state: default.dtype for state, default in self.host._defaults.items()}
        self.size = sum(default.numel() for default in self.host._defaults.values())
        higher = getattr(metric, "higher_is_better", None)
        self.goal = None if higher is None else "maximize" if higher else "minimize"
        self.on_device: dict[torch.device, Any] = {}  # a copy per device the states are computed on

    def _copy_on(self, device: torch.device) -> object:
        metric = self.on_device.get(device)
        if metric is None:
            metric = self.on_device[device] = copy.deepcopy(self.host).to(device)
        return metric

    def _update(self, metric: Any, batch: Batch) -> torch.Tensor:
        for state, default in metric._defaults.items():
            setattr(metric, state, default.detach().clone())
        type(metric).update(metric, batch.outputs, batch.target)
        return torch.cat([getattr(metric, state).reshape(-1).float() for state in metric._defaults])

    def check(self, batch: Batch, regression: bool) -> None:
        metric = self._copy_on(batch.outputs.device if isinstance(batch.outputs, torch.Tensor) else torch.device("cpu"))
        try:
            state = self._update(metric, batch)
            value = self.value(state.tolist(), strict=True)
        except OptionsError:
            raise
        except Exception as error:
            raise fail(
                f"the torchmetrics metric {self.name!r} ({type(metric).__name__}) failed on the first "
                f"batch (outputs {described(batch.outputs)}, targets {described(batch.target)}): "
                f"{type(error).__name__}: {error}"
            ) from error
        del value
        if hasattr(metric, "validate_args"):  # its input checks read tensors to the host: once is enough
            metric.validate_args = False

    def state(self, batch: Batch) -> torch.Tensor:
        return self._update(self._copy_on(batch.outputs.device), batch)

    def value(self, state: Sequence[float], strict: bool = False) -> float | None:
        metric, offset = self.host, 0
        for name, shape in self.shapes.items():
            count = math.prod(shape)
            values = torch.tensor(state[offset : offset + count], dtype=torch.float64)
            offset += count
            dtype = self.dtypes[name]
            values = values if dtype.is_floating_point else values.round()
            setattr(metric, name, values.to(dtype).reshape(shape))
        result = type(metric).compute(metric)
        if isinstance(result, torch.Tensor) and result.numel() == 1:
            number = float(result)
            return None if math.isnan(number) and not strict else number
        if strict:
            raise fail(
                f"the torchmetrics metric {self.name!r} ({type(metric).__name__}) computes "
                f"{described(result)}, not one number: ask it for one (e.g. average='macro')."
            )
        return None
