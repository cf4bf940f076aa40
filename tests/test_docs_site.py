"""The docs site builds as `make docs` builds it (mkdocs --strict: a broken link or anchor fails), and its API
reference is made from the docstrings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT

pytestmark = pytest.mark.slow


def test_the_docs_site_builds_strictly_with_an_api_reference_from_the_docstrings(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    api = (site / "api" / "index.html").read_text()
    assert 'id="nbscale.Pool.map"' in api and 'id="nbscale.TrainingOptions"' in api
    import nbscale

    assert nbscale.Pool.map.__doc__ is not None
    assert nbscale.Pool.map.__doc__.splitlines()[0].split(": ")[1] in api  # the docstring's own words
    assert (site / "install" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the pool](pool.md#no-such-heading).\n")
    (docs / "pool.md").write_text("# Pool\n")
    config = (REPO_ROOT / "mkdocs.yml").read_text().split("\nnav:")[0]  # the same settings, without the nav
    validation = (REPO_ROOT / "mkdocs.yml").read_text().split("\nvalidation:")[1].split("\nmarkdown_extensions:")[0]
    (tmp_path / "mkdocs.yml").write_text(f"{config}\nvalidation:{validation}\n")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"],  # not --quiet: it hides warnings from --strict
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in built.stdout + built.stderr
