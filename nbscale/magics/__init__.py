"""IPython magics: each only parses its line (magic_arguments, so `%pool?` gives help) and calls the API."""

from __future__ import annotations

from typing import Any

from nbscale.errors import NbscaleError, PoolInterrupted

# one module per area; each defines a Magics subclass named in this table
_MAGIC_CLASSES: list[tuple[str, str]] = [
    ("nbscale.magics.pool", "PoolMagics"),
    ("nbscale.magics.train", "TrainMagics"),
    ("nbscale.magics.gpu", "GpuMagics"),
    ("nbscale.magics.batch", "BatchMagics"),
    ("nbscale.magics.forms", "FormMagics"),
]


def show_user_error(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
    """Show an NbscaleError as its message alone: the user made a mistake, the internals are noise."""
    colour = str(getattr(shell, "colors", "")).lower() != "nocolor"
    structured = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}" if colour else f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, structured)  # IPython 9 shows nothing of what a handler returns
    return structured


def register(ipython: Any) -> None:
    """Register every magic class and the short display of nbscale's own errors."""
    import importlib

    for module_name, class_name in _MAGIC_CLASSES:
        magics_class = getattr(importlib.import_module(module_name), class_name)
        ipython.register_magics(magics_class)
    ipython.set_custom_exc((NbscaleError, PoolInterrupted), show_user_error)
