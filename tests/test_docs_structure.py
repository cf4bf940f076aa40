"""Each user page in docs/ stays scannable: task sections, a "How it works" part that points to
docs/architecture.md for the internals, and no section that is a wall of prose."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT

DOCS = REPO_ROOT / "docs"
# pages that are references or internals by nature, not user guides
NOT_USER_PAGES = {
    *("architecture.md", "development.md", "reference.md", "security.md", "troubleshooting.md", "cli.md"),
    *("index.md", "api.md"),  # the docs site's home page and its API reference (generated from the docstrings)
}
USER_PAGES = sorted(page for page in DOCS.glob("*.md") if page.name not in NOT_USER_PAGES)
MAX_PROSE_WORDS = 400  # about a screen: past it a section wants headings of its own


def sections(page: Path) -> list[tuple[str, str]]:
    """(heading, text under it up to the next heading) for each heading of `page`; code blocks dropped."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '# comment' in a code block is no heading
    parts = re.split(r"^(#{1,6}\s+.*?)\s*$", text, flags=re.M)
    return [("(top)", parts[0])] + list(zip(parts[1::2], parts[2::2], strict=True))


def prose_words(text: str) -> int:
    """Words of prose: table rows are reference, not prose."""
    return sum(len(line.split()) for line in text.splitlines() if not line.lstrip().startswith("|"))


def test_the_user_pages_are_found() -> None:
    assert {"training.md", "pool.md", "data.md", "jobs.md"} <= {page.name for page in USER_PAGES}


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_each_user_page_has_a_how_it_works_section_that_links_to_the_architecture(page: Path) -> None:
    found = [body for heading, body in sections(page) if re.fullmatch(r"##\s+How it works", heading)]
    assert found, f"{page.name} has no '## How it works' section"
    assert "architecture.md" in found[0], f"{page.name}'s How it works does not link to architecture.md"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_no_section_of_a_user_page_is_a_wall_of_prose(page: Path) -> None:
    walls = [
        f"{heading} ({words} words)"
        for heading, body in sections(page)
        if (words := prose_words(body)) > MAX_PROSE_WORDS
    ]
    assert not walls, f"{page.name}: split these sections (at most {MAX_PROSE_WORDS} words of prose each): {walls}"
