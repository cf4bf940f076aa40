"""Shared fixtures: real kernels, real data written to disk, and the gpu marker's skip."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Ray clusters started by tests stay on loopback: Ray reads this when imported, so it is set before any test runs.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tests.kernel_session import KernelSession


def _gpu_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_visible():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def kernel() -> Iterator[KernelSession]:
    """A fresh real kernel with `%load_ext nbscale` already run; shut down (and its pool) afterwards."""
    session = KernelSession()
    session.run("%load_ext nbscale")
    yield session
    session.run("import nbscale\np = nbscale.current_pool(start=False)\nif p is not None: p.close()", timeout=30)
    session.shutdown()
