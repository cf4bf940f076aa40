"""A real Jupyter server (pytest-jupyter's jp_serverapp) with nbscale's server extension enabled."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"nbscale": True}}}


@pytest.fixture
def pool_dir(tmp_path, monkeypatch):
    """An empty pool registry folder for this test (NBSCALE_RUNTIME_DIR)."""
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path / "runtime"))
    from nbscale.pool import registry

    return registry.registry_dir()
