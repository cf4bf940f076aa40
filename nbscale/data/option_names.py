"""Keyword names the data classes take: a wrong one (MATLAB's CamelCase, a typo) names the option meant."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from nbscale.errors import OptionsError
from nbscale.suggestions import did_you_mean


def check_option_names(
    owner: str, given: Iterable[str], known: Sequence[str], meant: Mapping[str, str] | None = None
) -> None:
    """Raise OptionsError for the first name in `given` that is not in `known`.

    The message suggests the snake_case of a MATLAB name (RandXReflection -> rand_x_reflection), a close match, or
    the entry of `meant` for names whose MATLAB meaning has another name here (data_augmentation -> augmenter).
    """
    for name in given:
        if name in known:
            continue
        snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
        hint = did_you_mean(snake, known, meant=meant)
        raise OptionsError(f"{owner} has no option {name!r}.{hint} Its options are: {', '.join(known)}.")


def keyword_names(function: Callable[..., object]) -> list[str]:
    """The names `function` takes by keyword, in order (self left out)."""
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if name != "self" and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]
