"""BENCHMARKS.md is one table of where each figure stands now, each row dated, with a command that exists; the
dated history is bench/HISTORY.md, and `make bench`'s script adds its run there, newest first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT

BENCHMARKS = REPO_ROOT / "BENCHMARKS.md"
HISTORY = REPO_ROOT / "bench" / "HISTORY.md"
MARKER = "<!-- new runs go below this line -->"


def _rows() -> list[list[str]]:
    rows = [line for line in BENCHMARKS.read_text().splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[2:]]  # past header and rule


def test_benchmarks_is_one_table_of_where_each_figure_stands() -> None:
    text = BENCHMARKS.read_text()
    assert not re.search(r"^#{2,} ", text, re.M), "BENCHMARKS.md has sections again: their history is bench/HISTORY.md"
    tables = re.findall(r"(?:^\|.*\n)+", text, re.M)
    assert len(tables) == 1 and tables[0].startswith("| figure | now | target | measured |")
    rows = _rows()
    assert len(rows) >= 20 and all(len(row) == 4 for row in rows)
    undated = [row[0] for row in rows if not re.search(r"\b2026-\d\d-\d\d\b", row[3]) and "not yet" not in row[1]]
    assert not undated, f"rows that do not say when they were measured: {undated}"


def test_every_script_the_table_names_exists() -> None:
    scripts = set(re.findall(r"bench/[\w.]+\.(?:py|sh)", BENCHMARKS.read_text()))
    assert scripts and all((REPO_ROOT / script).exists() for script in scripts), scripts


@pytest.mark.slow  # a real run of the script: it imports torch
def test_make_bench_adds_its_run_to_the_history_newest_first(tmp_path: Path) -> None:
    assert "bench/run_all.py --history bench/HISTORY.md" in (REPO_ROOT / "Makefile").read_text()
    assert HISTORY.read_text().count(MARKER) == 1
    history = tmp_path / "HISTORY.md"
    history.write_text(f"# Benchmark history\n\n{MARKER}\n\n## 2026-11-01 00:00: an older run\n")
    command = [sys.executable, str(REPO_ROOT / "bench" / "run_all.py"), "--only", "no_such_section"]
    subprocess.run([*command, "--history", str(history)], check=True, capture_output=True, timeout=120)
    text = history.read_text()
    assert re.search(rf"{MARKER}\n\n## \d{{4}}-\d\d-\d\d \d\d:\d\d: `make bench`\n\nMachine: ", text), text
    assert text.index("`make bench`") < text.index("an older run")
    history.write_text("# a history without its marker\n")
    refused = subprocess.run([*command, "--history", str(history)], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "has no line" in refused.stderr and MARKER in refused.stderr
