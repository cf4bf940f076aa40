"""The Jupyter server extension behind nbscale's JupyterLab panel: a few authenticated JSON endpoints.

`nbscale/__init__.py` names this module in `_jupyter_server_extension_points`; pip installs
`jupyter-config/jupyter_server_config.d/nbscale.json`, which enables it in every Jupyter server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbscale.lab_extension import NOT_INSTALLED, installed_lab_extension
from nbscale.server.handlers import setup_handlers

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

# A training cell asks its own kernel for a subshell (nbscale.ui.click_routing), and the kernel announces each such
# control request as busy, then idle, on IOPub. JupyterLab takes every status message as the kernel's state unless
# the request's type is "untracked", so without this its status bar said "Idle" while the training cell ran.
SUBSHELL_MESSAGE_TYPES = [
    f"{verb}_subshell_{kind}" for verb in ("create", "delete", "list") for kind in ("request", "reply")
]


def _load_jupyter_server_extension(server_app: ServerApp) -> None:
    """Register the `/nbscale/api/...` handlers with the running Jupyter server."""
    setup_handlers(server_app.web_app)
    _untrack_subshell_messages(server_app)
    server_app.log.info("nbscale: server extension loaded (/nbscale/api/)")
    if installed_lab_extension() is None:
        server_app.log.warning(f"nbscale: {NOT_INSTALLED}")


def _untrack_subshell_messages(server_app: ServerApp) -> None:
    """Add the subshell control messages to the server's untracked message types, which JupyterLab's page config
    carries (set by JupyterLab's extension when it loads, so also added there where it loaded first); they are not
    user activity either, for the idle-kernel culler."""
    kernels = server_app.kernel_manager
    tracked = getattr(kernels, "untracked_message_types", None)
    if tracked is None:
        return
    kernels.untracked_message_types = [*tracked, *(t for t in SUBSHELL_MESSAGE_TYPES if t not in tracked)]
    page_config = server_app.web_app.settings.get("page_config_data", {})
    if "untracked_message_types" in page_config:
        shown = page_config["untracked_message_types"]
        page_config["untracked_message_types"] = [*shown, *(t for t in SUBSHELL_MESSAGE_TYPES if t not in shown)]
