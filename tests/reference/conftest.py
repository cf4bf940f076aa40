"""The pool the differential suite's pool rows share: one of 2 CPU workers per test module, closed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import nbscale


@pytest.fixture(scope="module")
def pool() -> Iterator[nbscale.Pool]:
    with nbscale.Pool(2, cpu=True) as started:
        yield started
