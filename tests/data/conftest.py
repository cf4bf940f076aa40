"""Data fixtures: digits as PNG class folders and sample photos as JPEGs, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datasets import write_digits_pngs, write_sample_jpegs


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All 1797 digits, 8x8 grayscale PNGs, in folders 0..9."""
    return write_digits_pngs(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="session")
def photos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two RGB JPEGs (china, flower), 64x48, each in its own class folder."""
    return write_sample_jpegs(tmp_path_factory.mktemp("photos"))
