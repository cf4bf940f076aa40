"""What the magics share: their line split as a shell would, comma-separated indices, KEY=VALUE pairs."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from IPython.core import magic as ipython_magic
from IPython.core import magic_arguments as ipython_arguments
from IPython.core.error import UsageError

from nbscale.errors import NbscaleError, PoolError

_INDEX_LISTS = ("--gpus", "--targets")

_Magic = TypeVar("_Magic", bound=Callable[..., object])


class MagicDecorator(Protocol):
    """A decorator that returns the magic it is given (its signature kept for mypy)."""

    def __call__(self, magic: _Magic, /) -> _Magic: ...


def magic_arguments() -> MagicDecorator:
    """IPython's `magic_arguments` decorator, typed (IPython's is not): the magic keeps its own signature."""
    return cast(MagicDecorator, ipython_arguments.magic_arguments())


def argument(*names: str, **settings: object) -> MagicDecorator:
    """IPython's `argument` decorator (argparse's add_argument words), typed as `magic_arguments` is."""
    return cast(MagicDecorator, ipython_arguments.argument(*names, **settings))


def line_magic(magic: _Magic) -> _Magic:
    """IPython's `line_magic` marker, typed: IPython's returns a union of the magic and a decorator."""
    return cast(_Magic, ipython_magic.line_magic(magic))


def cell_magic(magic: _Magic) -> _Magic:
    """IPython's `cell_magic` marker, typed as `line_magic` is."""
    return cast(_Magic, ipython_magic.cell_magic(magic))


def parse_line(magic: Any, line: str) -> argparse.Namespace:
    """`line` parsed with `magic`'s magic_arguments parser, split as a shell splits it: quotes group words and
    are removed (`--env "GREETING=hello world"`), which IPython's own splitting keeps, and a `# comment` after
    the flags is left out (`%pool start 4  # four workers`). An index list written with spaces after its commas
    (`--targets 1, 2`) is read as one (`1,2`)."""
    try:
        argv = shlex.split(without_comment(line))
    except ValueError as error:  # an unclosed quote
        raise UsageError(f"{line.strip()!r}: {error}; close the quote.") from None
    return cast(argparse.Namespace, magic.parser.parse_args(_join_index_lists(argv)))


def without_comment(line: str) -> str:
    """`line` up to a `#` that begins a word outside quotes, where a shell's comment begins: `4  # four` is `4`,
    while `--env "KEY=a # b"` and `--env KEY=a#b` keep theirs (a `#` inside a word is part of it, as in a shell,
    so a secret holding one is not cut short)."""
    quote = None
    escaped = False
    for position, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line


def _join_index_lists(argv: list[str]) -> list[str]:
    """argv with the words of a --gpus/--targets value split at ', ' joined again: '1,' '2' -> '1,2'."""
    joined: list[str] = []
    in_list = False  # whether the last word is (part of) an index list's value
    for word in argv:
        if in_list and (joined[-1].endswith(",") or word.startswith(",")):
            joined[-1] += word
            continue
        follows_option = bool(joined) and joined[-1] in _INDEX_LISTS
        in_list = follows_option or word.startswith(tuple(f"{option}=" for option in _INDEX_LISTS))
        joined.append(word)
    return joined


def batch_size(text: str) -> int | str:
    """--batch-size: a whole number, or 'auto' (mini_batch_size="auto", fitted to GPU memory)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number or auto (e.g. --batch-size 128, --batch-size auto)"
        ) from None


def int_list(text: str) -> list[int]:
    """'0,2' -> [0, 2] (for --gpus and --targets); ',' -> [] (the caller says an empty list is no good)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PoolError(f"{text!r} is not a comma-separated list of indices like 0,2.") from None


def env_pairs(pairs: list[str] | None, error: type[NbscaleError] = PoolError) -> dict[str, str]:
    """['KEY=VALUE', ...] -> dict, for --env of %pool start and %%batch; the values are never printed.

    Raises `error` for a pair without '=' or a name or value holding a NUL byte.
    """
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise error(f"--env takes KEY=VALUE pairs; {pair!r} has no '='. Example: --env NCCL_DEBUG=INFO")
        if not key:  # the value stays unshown: it may be a secret whose name was forgotten
            raise error("--env =...: a pair has no name before its '='. Give KEY=VALUE, e.g. --env NCCL_DEBUG=INFO")
        if "\0" in pair:
            raise error(
                f"--env {key.replace(chr(0), '?')}: the variable's name or value holds a NUL byte, which no "
                "environment variable can hold. Remove it."
            )
        env[key] = value
    return env
