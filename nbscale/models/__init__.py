"""Networks for transfer learning: torchvision networks by name, and a new classification layer.

`transfer()` records per-parameter learn-rate factors in `model.nbscale_learn_rate_factors` and freezes
layers with `requires_grad=False`; `learn_rates.param_groups(model, base_lr)` turns both into optimizer groups.
"""

from __future__ import annotations

from nbscale.models.learn_rates import (
    learn_rate_factors,
    param_groups,
    set_learn_rate_factor,
    set_learn_rate_factors,
)
from nbscale.models.pretrained import pretrained
from nbscale.models.transfer import classification_layer, transfer

__all__ = [
    "pretrained",
    "transfer",
    "classification_layer",
    "param_groups",
    "set_learn_rate_factor",
    "set_learn_rate_factors",
    "learn_rate_factors",
]
