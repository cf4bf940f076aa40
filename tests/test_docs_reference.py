"""The docs name only flags and options that exist, and docs/reference.md lists every one (made from the code)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.reference_doc import PAGE, VARIABLES, magic_flags, render

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NBSCALE = REPO / "nbscale"


def test_the_reference_page_is_what_the_code_makes() -> None:
    assert PAGE.read_text() == render(), "docs/reference.md is out of date: run `make reference`"


def test_every_nbscale_variable_the_code_reads_is_in_the_reference() -> None:
    used = {name for path in NBSCALE.rglob("*.py") for name in re.findall(r"NBSCALE_[A-Z_]+", path.read_text())}
    used -= {"NBSCALE_DIR"}  # a module constant of worker.py, not an environment variable
    assert used <= set(VARIABLES), f"undocumented: {sorted(used - set(VARIABLES))}"


def _magic_uses(text: str) -> list[tuple[str, str]]:
    """(magic, the rest of its line up to a backtick or a table bar) for each magic written in `text`."""
    names = "|".join(sorted((re.escape(name) for name in magic_flags()), key=len, reverse=True))
    return re.findall(rf"(?<![\w%])({names})(?![\w])([^`\n|]*)", text)


def test_docs_name_only_magic_flags_that_exist() -> None:
    flags = magic_flags()
    wrong = []
    for page in PAGES:
        for magic, rest in _magic_uses(page.read_text()):
            for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest.split("#")[0]):
                if flag not in flags[magic]:
                    wrong.append(f"{page.name}: {magic} ... {flag}")
    assert not wrong, "docs name flags that do not exist:\n" + "\n".join(wrong)


def _call_keywords(text: str, call: str) -> list[str]:
    """The keyword names passed in every `call(...)` written in `text` (nested parentheses allowed)."""
    found = []
    for match in re.finditer(re.escape(call) + r"\(", text):
        depth, start = 1, match.end()
        end = start
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        inner, flat, depth = text[start : end - 1], [], 0
        for char in inner:  # keep the top level only: a keyword of a nested call is not this call's
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
            flat.append(char if depth == 0 or char in "([{" else " ")
        found += re.findall(r"(?<![\w.=])([a-z_][a-z0-9_]*)\s*=(?!=)", "".join(flat))
    return found


def test_docs_name_only_training_options_that_exist() -> None:
    from nbscale.training.options import field_names

    fields = set(field_names())
    wrong = [
        f"{page.name}: {name}"
        for page in PAGES
        for call in ("TrainingOptions", "opts.replace", "options.replace")
        for name in _call_keywords(page.read_text(), call)
        if name not in fields
    ]
    assert not wrong, "docs name TrainingOptions fields that do not exist:\n" + "\n".join(wrong)
