"""Naming what cannot be sent to the workers: the variable, argument or captured name that does not pickle.

Only called once sending has failed, to turn "cannot pickle '_thread.lock' object" into which value it was (or an
interrupt while pickling into one line saying nothing was sent).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from nbscale.errors import PoolInterrupted, UnsendableError
from nbscale.pool.transport import serialise


def interrupted_while_pickling() -> PoolInterrupted:
    """An interrupt while the kernel pickled what it was about to send (a large variable takes a while): nothing
    reached any worker, so the pool is as it was, which the user should hear rather than see pickle's frames."""
    return PoolInterrupted(
        "Interrupted while pickling what this sends to the workers: nothing was sent, and the pool is as it was."
    )


def variable_error(variables: Mapping[str, Any], error: Exception, fix: str) -> UnsendableError:
    """The error naming the first of `variables` that cannot be sent (`error`: what sending them all raised)."""
    for name, value in variables.items():
        failure = _failure(value)
        if failure is not None:
            return UnsendableError(
                f"Variable {name!r} cannot be sent to the workers ({type(value).__name__}: {failure}). {fix}"
            )
    return UnsendableError(f"The variables could not be sent to the workers: {error}")


def call_error(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], error: Exception
) -> UnsendableError:
    """The error naming what of `fn(*args, **kwargs)` cannot be sent: an argument, or a notebook variable the
    function uses or captures (cloudpickle sends those along with it)."""
    name = getattr(fn, "__name__", "the function")
    parts: list[tuple[str, Any]] = [(f"Argument {i + 1} of {name}()", a) for i, a in enumerate(args)]
    parts += [(f"Argument {key}= of {name}()", value) for key, value in kwargs.items()]
    try:
        captured = inspect.getclosurevars(fn)
    except (TypeError, ValueError):  # a builtin or a callable object: nothing captured to look through
        captured = None
    if captured is not None:
        used = {**captured.globals, **captured.nonlocals}
        parts += [
            (f"Variable {key!r}, which {name}() uses,", value)
            for key, value in used.items()
            if not inspect.ismodule(value)
        ]
    for described, value in parts:
        failure = _failure(value)
        if failure is not None:
            return UnsendableError(
                f"{described} cannot be sent to the workers ({type(value).__name__}: {failure}). "
                "Create it inside the function instead, or pass something picklable."
            )
    return UnsendableError(f"{name}() could not be sent to the workers: {error}")


def _failure(value: object) -> str | None:
    try:
        serialise(value)
    except Exception as error:  # any pickling failure is the answer
        return str(error)
    return None
