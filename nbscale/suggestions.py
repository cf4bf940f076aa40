"""The "did you mean" of every error about an unknown name (an option, a metric, a layer, a job...)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


def close_names(name: str, names: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to `n` of `names` close to `name` (difflib's similarity >= `cutoff`), closest first."""
    return difflib.get_close_matches(name, list(names), n=n, cutoff=cutoff)


def did_you_mean(
    name: str, names: Iterable[str], n: int = 1, cutoff: float = 0.6, meant: Mapping[str, str] | None = None
) -> str:
    """ " Did you mean 'a', 'b'?" naming up to `n` close names, or "" when none is close: the sentence to put
    after an error's first one (it starts with a space).

    `meant` maps names that are known mistakes to the name meant (MATLAB's "f1" -> "fscore"); it wins over
    closeness.
    """
    close = [meant[name]] if meant and name in meant else close_names(name, names, n, cutoff)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
