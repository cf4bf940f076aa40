"""The Jupyter server extension behind nbscale's JupyterLab panel: a few authenticated JSON endpoints.

`nbscale/__init__.py` names this module in `_jupyter_server_extension_points`; pip installs
`jupyter-config/jupyter_server_config.d/nbscale.json`, which enables it in every Jupyter server.
"""

from __future__ import annotations

from typing import Any

from nbscale.server.handlers import setup_handlers


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Register the `/nbscale/api/...` handlers with the running Jupyter server."""
    setup_handlers(server_app.web_app)
    server_app.log.info("nbscale: server extension loaded (/nbscale/api/)")
