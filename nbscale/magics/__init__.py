"""IPython magics: each only parses its line (magic_arguments, so `%pool?` gives help) and calls the API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbscale.errors import NbscaleError, PoolInterrupted

if TYPE_CHECKING:
    from types import TracebackType

    from IPython.core.interactiveshell import InteractiveShell

# one module per area; each defines a Magics subclass named in this table
_MAGIC_CLASSES: list[tuple[str, str]] = [
    ("nbscale.magics.pool", "PoolMagics"),
    ("nbscale.magics.train", "TrainMagics"),
    ("nbscale.magics.gpu", "GpuMagics"),
    ("nbscale.magics.batch", "BatchMagics"),
    ("nbscale.magics.forms", "FormMagics"),
]


_OURS = (NbscaleError, PoolInterrupted)


class UserErrorDisplay:
    """IPython's custom exception handler while nbscale is loaded: an NbscaleError shows as its message alone
    (the user made a mistake, the internals are noise) unless `%xmode Verbose` asks for every traceback; any other
    exception goes to the handler that was installed before nbscale's (IPython keeps one), which `restore` puts
    back at `%unload_ext nbscale`."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.previous_types: tuple[type, ...] = tuple(shell.custom_exceptions or ())
        self.previous_handler: Any = shell.CustomTB if self.previous_types else None

    def install(self, shell: InteractiveShell) -> None:
        shell.set_custom_exc((*_OURS, *self.previous_types), self)

    def restore(self, shell: InteractiveShell) -> None:
        if self.previous_handler is not None:
            shell.custom_exceptions, shell.CustomTB = self.previous_types, self.previous_handler
        else:
            shell.custom_exceptions = ()

    def __call__(
        self,
        shell: InteractiveShell,
        etype: type,
        value: BaseException,
        tb: TracebackType | None,
        tb_offset: int | None = None,
    ) -> list[str]:
        if not issubclass(etype, _OURS) and self.previous_handler is not None:
            return list(self.previous_handler(etype, value, tb, tb_offset))
        if not issubclass(etype, _OURS) or _verbose(shell):
            structured: list[str] = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        else:
            colour = str(getattr(shell, "colors", "")).lower() != "nocolor"
            structured = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}" if colour else f"{etype.__name__}: {value}"]
        shell._showtraceback(etype, value, structured)  # IPython 9 shows nothing of what a handler returns
        return structured


def _verbose(shell: InteractiveShell) -> bool:
    return str(getattr(shell.InteractiveTB, "mode", "")).lower() == "verbose"


_installed: dict[int, tuple[UserErrorDisplay, list[Any]]] = {}  # by shell: its error display and magics objects


def register(ipython: InteractiveShell) -> None:
    """Register every magic class and the short display of nbscale's own errors (once per shell)."""
    import importlib

    if id(ipython) in _installed:
        return
    instances = []
    for module_name, class_name in _MAGIC_CLASSES:
        magics_class = getattr(importlib.import_module(module_name), class_name)
        instance = magics_class(shell=ipython)
        ipython.register_magics(instance)
        instances.append(instance)
    display = UserErrorDisplay(ipython)
    display.install(ipython)
    _installed[id(ipython)] = (display, instances)


def unregister(ipython: InteractiveShell) -> None:
    """Undo `register`: the magics go, and the error handler that was there before comes back."""
    display, instances = _installed.pop(id(ipython), (None, []))
    if display is None:
        return
    registry = ipython.magics_manager.magics
    for instance in instances:
        for kind, names in instance.magics.items():
            for name in names:
                registry[kind].pop(name, None)
    display.restore(ipython)
