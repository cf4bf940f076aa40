"""The README's quick start runs as written in a real kernel, and the README stays a short page."""

from __future__ import annotations

import re

import pytest

from tests.kernel_session import REPO_ROOT, KernelSession

README = REPO_ROOT / "README.md"


def quick_start_code() -> str:
    """The first python block after the README's "Quick start" heading, as a user would paste it."""
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the Quick start section has no python block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_quick_start_trains_in_the_notebook_and_on_a_pool() -> None:
    session = KernelSession()
    try:
        result = session.run(quick_start_code(), timeout=240)
        assert result.ok, result.text
        accuracies = re.findall(r"validation accuracy (\d\.\d+)", result.stdout)
        assert len(accuracies) == 2, result.stdout
        assert all(float(a) >= 0.85 for a in accuracies), result.stdout
        in_notebook, on_pool = [line for line in result.stdout.splitlines() if "validation accuracy" in line]
        assert "2 workers" in on_pool and "workers" not in in_notebook, result.stdout
    finally:
        session.close()


def test_the_readme_fits_a_screen_and_links_to_pages_that_exist() -> None:
    text = README.read_text()
    assert len(text.encode()) <= 8 * 1024
    for link in re.findall(r"\]\(((?:docs|examples)/[^)#]*)", text):
        assert (REPO_ROOT / link).exists(), link
