"""A real Jupyter server (pytest-jupyter's jp_serverapp) with nbscale's server extension enabled."""

from __future__ import annotations

import pytest

# pytest-jupyter's fixtures and async-test hooks, for this folder only: its autouse fixtures (an event loop and
# a ServerApp clean-up around every test) have no business in the rest of the suite. (pytest_plugins is allowed
# only in the top-level conftest.)
from pytest_jupyter.jupyter_server import *  # noqa: F403

from nbscale.lab_extension import STATUS_KEPT_VARIABLE


@pytest.fixture(autouse=True)
def _kernels_not_told_by_this_server(monkeypatch):
    """The extension tells the kernels its server starts that it keeps their status (an environment variable of
    this process): undone after each test, so later kernels of this test process are not told."""
    monkeypatch.setenv(STATUS_KEPT_VARIABLE, "")


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"nbscale": True}}}


@pytest.fixture
def pool_dir(tmp_path, monkeypatch):
    """An empty pool registry folder for this test (NBSCALE_RUNTIME_DIR)."""
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path / "runtime"))
    from nbscale.pool import registry

    return registry.registry_dir()
