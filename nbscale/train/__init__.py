"""Training (trainNetwork): options, the loop, checkpoints, and the pool path.

`nbscale.train` is both this package and the function: importing a submodule makes Python bind the package
to `nbscale.train`, so the package itself is callable and forwards to `nbscale.train.trainer.train`.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from nbscale.train.trainer import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
