"""How plain-data results show themselves: text and HTML renderers that the ui layer registers by type name.

The core (pool, gpu, train) returns plain data and never imports nbscale.ui. A result class that derives from
`Rendered` gets a `repr()` and an `_repr_html_` (what notebooks show) from the renderer registered for its type,
so `%pool status` is a table in a notebook and aligned text in a terminal. nbscale.ui.renderers registers them
when nbscale is imported; a type without a renderer shows as its plain dataclass repr.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple


class Renderer(NamedTuple):
    text: Callable[[Any], str]
    html: Callable[[Any], str] | None = None


_renderers: dict[str, Renderer] = {}
_viewers: dict[str, Callable[..., Any]] = {}


def register(type_name: str, text: Callable[[Any], str], html: Callable[[Any], str] | None = None) -> None:
    """Show instances of the class `type_name` ("module.QualName") with `text` (repr) and `html` (notebooks).

    By name, so that registering does not import the class's module (and torch with it).
    """
    _renderers[type_name] = Renderer(text, html)


def register_viewer(type_name: str, view: Callable[..., Any]) -> None:
    """Show instances of `type_name` live in a notebook with `view(value, **options)` (e.g. `Job.show`)."""
    _viewers[type_name] = view


def show(value: object, **options: object) -> Any:
    """Display `value` with its registered viewer; RuntimeError when the ui layer registered none."""
    kind = type(value)
    view = _viewers.get(f"{kind.__module__}.{kind.__qualname__}")
    if view is None:
        raise RuntimeError(f"Nothing can display a {kind.__name__} here: import nbscale (its ui layer) first.")
    return view(value, **options)


def _renderer(value: object) -> Renderer | None:
    kind = type(value)
    return _renderers.get(f"{kind.__module__}.{kind.__qualname__}")


class Rendered:
    """Mixin for result classes: `repr()` and `_repr_html_()` come from the registered renderer."""

    __slots__ = ()

    def __repr__(self) -> str:
        renderer = _renderer(self)
        return renderer.text(self) if renderer is not None else _plain_repr(self)

    def _repr_html_(self) -> str | None:
        renderer = _renderer(self)
        return renderer.html(self) if renderer is not None and renderer.html is not None else None


def _plain_repr(value: object) -> str:
    if dataclasses.is_dataclass(value):
        fields = ", ".join(f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value) if f.repr)
        return f"{type(value).__name__}({fields})"
    return object.__repr__(value)
