"""Reading torch files without running code from them: torch's weights-only unpickler plus an exact allow-list.

`torch.load(weights_only=True)` builds tensors and plain values only; `allowed` adds exact (module, name)
pairs, never a prefix. A file that refers to anything else raises `RefusedPickle` naming it, and nothing of it
runs. Used for checkpoints (nbscale.training.checkpoint) and weights files (nbscale.models.pretrained).
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from typing import IO, Any

import torch

# torch's refusal names the global in one of these phrases (its message is otherwise advice to load unsafely)
_NAMED = re.compile(
    r"GLOBAL (\S+) (?:was not an allowed global|whose module)|unrecognized function (.+?)(?: which|$)", re.M
)


# how torch's unpickler words a refusal (other failures are files it cannot parse)
_REFUSALS = (
    "Unsupported global",
    "Trying to load unsupported GLOBAL",
    "Can only create new object",
    "Trying to call reduce",
    "Can only build",
    "Can only append",
)


class RefusedPickle(Exception):
    """The file refers to globals outside the allow-list (or asks for an operation torch refuses)."""

    def __init__(self, names: list[str], detail: str) -> None:
        super().__init__(detail)
        self.names = names
        self.detail = detail

    def describe(self) -> str:
        """'refers to [...]' or what torch's unpickler refused, in one line."""
        return f"refers to {self.names[:5]}" if self.names else self.detail


def load_restricted(stream: IO[bytes], allowed: Mapping[tuple[str, str], Callable[..., Any]]) -> Any:
    """torch.load `stream` (an open binary file, seekable) onto the CPU with exactly `allowed` as extra globals.

    Raises RefusedPickle without running anything from the file when it refers to other globals; other
    errors (not a torch file, truncated) as torch raises them.
    """
    try:
        with torch.serialization.safe_globals(_safe_globals(_referred_to(stream, allowed))):
            return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        names, detail = _refused_names(stream, allowed, error), _detail(error)
        if names or detail.startswith(_REFUSALS):
            raise RefusedPickle(names, detail) from None
        raise pickle.UnpicklingError(f"not a torch file, or a damaged one: {detail}") from None


def _referred_to(
    stream: IO[bytes], allowed: Mapping[tuple[str, str], Callable[..., Any]]
) -> Mapping[tuple[str, str], Callable[..., Any]]:
    """The part of `allowed` the file refers to (all of it where the file cannot be listed): torch's unpickler
    rebuilds its table of allowed globals at each global the file names, so a whole network (thousands of them)
    against the full allow-list took seconds. A name outside `allowed` is refused by torch as before."""
    try:
        listed = set(torch.serialization.get_unsafe_globals_in_checkpoint(stream))
    except Exception:  # not in the zip format, or an older torch: the whole allow-list, as torch.load reads it
        return allowed
    finally:
        stream.seek(0)
    return {key: value for key, value in allowed.items() if f"{key[0]}.{key[1]}" in listed}


def _safe_globals(
    allowed: Mapping[tuple[str, str], Callable[..., Any]],
) -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """`allowed` as torch.serialization.safe_globals takes it. torch 2.6+ takes (global, "module.name") pairs;
    torch 2.5 takes the globals alone and names each by its __module__ and __name__, so there a pair named
    otherwise is left out, and a file referring to that name is refused as any other. torch 2.5 also lacks
    builtins.set among its own globals (a whole network's hooks hold sets), which 2.6+ allows: added there."""
    if _TAKES_NAMED_GLOBALS:
        return [(value, f"{module}.{name}") for (module, name), value in allowed.items()]
    named_alike = [
        value
        for (module, name), value in allowed.items()
        if (getattr(value, "__module__", None), getattr(value, "__name__", None)) == (module, name)
    ]
    return [set, *named_alike]


_TAKES_NAMED_GLOBALS = torch.__version__ >= "2.6"  # torch's TorchVersion compares by release, not as text


def _refused_names(
    stream: IO[bytes], allowed: Mapping[tuple[str, str], Callable[..., Any]], error: Exception
) -> list[str]:
    known = {f"{module}.{name}" for module, name in allowed}
    try:
        stream.seek(0)
        listed = torch.serialization.get_unsafe_globals_in_checkpoint(stream)
    except Exception:  # not in the zip format (a bare pickle): take the name from torch's refusal
        listed = [next(part for part in found if part) for found in _NAMED.findall(str(error))]
    return [name for name in listed if name not in known]


def _detail(error: Exception) -> str:
    """What torch's unpickler refused, without its advice (load unsafely, or allow-list what was refused)."""
    text = str(error)
    _, found, after = text.partition("WeightsUnpickler error:")
    detail = (after if found else text).strip().split("\n\n")[0].strip() or text.strip()
    return " ".join(detail.split(". Please use")[0].split())
