"""Every error text the docs quote is one the code prints: the first column of docs/troubleshooting.md's tables
(the words you see), and anywhere in docs/ a quoted `SomeError: ...`, `Warning: ...` or `nbscale: error: ...`.

A quote may leave parts out (`...`) and show example values (`worker 1 (pid 4242)`, `'lr'`, `N`, `FOLDER`,
`<field>`): the rest must be made of the string literals in nbscale/ (f-strings' literal parts included), with at
most one word in a row that no literal holds (a name the code formats in), and 80% of each stretch of words
between two values in one literal, so that a reworded message fails.
"""

from __future__ import annotations

import ast
import re
from functools import cache

import pytest

from tests.kernel_session import REPO_ROOT

DOCS = REPO_ROOT / "docs"
CLASS_PREFIX = re.compile(r"^(?:[A-Z]\w*(?:Error|Interrupted|Exception)|Warning|nbscale: error|\[nbscale\]): ?")
QUOTED_ERROR = re.compile(r"`((?:[A-Z]\w*(?:Error|Interrupted)|Warning|nbscale: error): [^`]{12,})`")
# not printed by nbscale: Python's, CUDA's or another library's own messages, quoted for what they mean
NOT_OURS = re.compile(r"^(?:ModuleNotFoundError|ImportError|OSError|RuntimeError|Cannot re-initialize CUDA|cd: )")
# example values; with the operating system's and pickle's own words that messages carry
VALUE = re.compile(
    r"No such file or directory|cannot pickle|\.\.\.|…|<[^>]*>|'[^']*'|\"[^\"]*\"|\S*\d\S*"
    r"|\b[A-Z][A-Z_]+\b|\b[A-Z]\b|\S*[/$=]\S*|\b[a-z]+'s\b|\(\.\.\.\)"
)
# a word a message formats in: a name (ResNet, CheckpointFrequencyUnit), a number or float's repr, a path
VALUE_WORD = re.compile(r"[A-Z]\w*|\w*[_\d]\w*|\S*[^\w\s]\S*|nan|inf")
MIN_PIECE = 4  # a shorter match (", ", "s ") counts only at the end of a stretch


def quotes() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        if page.name == "troubleshooting.md":
            found += [(page.name, quote) for quote in re.findall(r"^\| `([^`]+)`", text, flags=re.M)]
        found += [(page.name, quote) for quote in QUOTED_ERROR.findall(text)]
    return sorted({(name, quote) for name, quote in found if not NOT_OURS.match(quote)})


@cache
def code_strings() -> str:
    """Every string literal of nbscale/ (and of the build hook), each f-string's literal parts apart,
    NUL-separated, whitespace collapsed."""
    pieces: list[str] = []
    for path in [*sorted((REPO_ROOT / "nbscale").rglob("*.py")), REPO_ROOT / "hatch_build.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                pieces.append(node.value)
    return "\0".join(re.sub(r"\s+", " ", piece) for piece in pieces)


def _longest_piece(text: str, start: int, corpus: str) -> int:
    """The length of the longest text[start:start+n] found in one literal (binary search: substrings of a match
    match too)."""
    low, high = 0, len(text) - start
    while low < high:
        middle = (low + high + 1) // 2
        if text[start : start + middle] in corpus:
            low = middle
        else:
            high = middle - 1
    return low


def unexplained(quote: str) -> list[str]:
    """The parts of `quote` no literal of the code gives, except example values; [] when the code prints it."""
    text = CLASS_PREFIX.sub("", " ".join(quote.split()))
    bounds = [0, *(edge for match in VALUE.finditer(text) for edge in match.span()), len(text)]
    problems = []
    for start, end in zip(bounds[::2], bounds[1::2], strict=True):
        segment = text[start:end].strip(" .,;:?!()[]-")
        if segment and (problem := _unexplained_segment(segment)):
            problems.append(problem)
    return problems


def _unexplained_segment(segment: str) -> str | None:
    """Why the words between two example values are not the code's: two words in a row no literal holds, or (three
    words or more) neither one literal holding 80% of it nor whole literals joined (an f-string's parts and the
    values it formats in)."""
    corpus, position, longest, skipped = code_strings(), 0, 0, 0
    while position < len(segment):
        length = _longest_piece(segment, position, corpus)
        if length >= MIN_PIECE or (length and position + length == len(segment)):
            position, longest, skipped = position + length, max(longest, length), 0
            continue
        skipped += 1  # one word the code formats in (a name, a kind), as an example value
        if skipped == 2:
            return f"{segment[position:]!r} is in no string of the code"
        after = segment.find(" ", position + 1)
        position = len(segment) if after < 0 else after
    if len(segment.split()) >= 3 and longest < 0.8 * len(segment) and not _whole_literals_joined(segment):
        return f"{segment!r} is pieced together from bits of the code's strings (a reworded message?)"
    return None


def _whole_literals_joined(segment: str) -> bool:
    """Whether `segment` is whole literals one after the other, with single VALUE_WORDs between them (values the
    code formats in); the first literal may be cut at its start, the last at its end."""
    corpus = f"\0{code_strings()}\0"
    reached = {(0, False)}  # (position, whether a value word ended there)
    for start in range(len(segment)):
        for after_value in (False, True):
            if (start, after_value) not in reached:
                continue
            for end in range(start + 1, len(segment) + 1):
                left, right = "" if start == 0 else "\0", "" if end == len(segment) else "\0"
                if f"{left}{segment[start:end]}{right}" in corpus:
                    reached.add((end, False))
            word_end = segment.find(" ", start + 1)
            word_end = len(segment) if word_end < 0 else word_end
            if not after_value and VALUE_WORD.fullmatch(segment[start:word_end].strip()):
                reached.add((word_end, True))
    return (len(segment), False) in reached or (len(segment), True) in reached


@pytest.mark.parametrize(("page", "quote"), quotes(), ids=lambda value: value[:50])
def test_every_error_text_the_docs_quote_is_in_the_code(page: str, quote: str) -> None:
    assert not unexplained(quote), f"{page} quotes `{quote}`, which nbscale does not print: {unexplained(quote)}"


def test_the_check_itself_refuses_a_reworded_or_invented_message() -> None:
    assert not unexplained("TrainingOptions has no field 'lr'. Did you mean 'initial_learn_rate'?")
    assert unexplained("TrainingOptions has no setting called 'lr'. Did you mean 'initial_learn_rate'?")
    assert unexplained("Training loss became nan at iteration ...")
    assert unexplained("The pool could not start its workers in time")
