"""The Jupyter server extension behind nbscale's JupyterLab panel: a few authenticated JSON endpoints.

`nbscale/__init__.py` names this module in `_jupyter_server_extension_points`; pip installs
`jupyter-config/jupyter_server_config.d/nbscale.json`, which enables it in every Jupyter server.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from nbscale.lab_extension import NOT_INSTALLED, STATUS_KEPT_VARIABLE, installed_lab_extension
from nbscale.server.handlers import setup_handlers

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

# A training cell asks its own kernel for a subshell (nbscale.ui.click_routing), and the kernel announces each such
# control request as busy, then idle, on IOPub; so does the subshell for each widget message it handles while the
# cell runs (a click, a view's "ready"). JupyterLab, and the server's own record of the kernel's state, take every
# status message as the kernel's unless the request's type is "untracked", so without this the status bar said
# "Idle" while the training cell ran.
UNTRACKED_MESSAGE_TYPES = [
    *(f"{verb}_subshell_{kind}" for verb in ("create", "delete", "list") for kind in ("request", "reply")),
    "comm_msg",
]


def _load_jupyter_server_extension(server_app: ServerApp) -> None:
    """Register the `/nbscale/api/...` handlers with the running Jupyter server."""
    setup_handlers(server_app.web_app)
    if _untrack_widget_and_subshell_messages(server_app):
        os.environ[STATUS_KEPT_VARIABLE] = "1"  # inherited by the kernels it starts: they may draw live figures
    server_app.log.info("nbscale: server extension loaded (/nbscale/api/)")
    if installed_lab_extension() is None:
        server_app.log.warning(f"nbscale: {NOT_INSTALLED}")


def _untrack_widget_and_subshell_messages(server_app: ServerApp) -> bool:
    """Add the subshell control messages and comm messages to the server's untracked message types, which
    JupyterLab's page config carries (set by JupyterLab's extension when it loads, so also added there where it
    loaded first). For the idle-kernel culler they are then not user activity of an idle kernel either (a busy
    kernel's messages always are). False where this server has no such setting."""
    kernels = server_app.kernel_manager
    tracked = getattr(kernels, "untracked_message_types", None)
    if tracked is None:
        return False
    kernels.untracked_message_types = [*tracked, *(t for t in UNTRACKED_MESSAGE_TYPES if t not in tracked)]
    page_config = server_app.web_app.settings.get("page_config_data", {})
    if "untracked_message_types" in page_config:
        shown = page_config["untracked_message_types"]
        page_config["untracked_message_types"] = [*shown, *(t for t in UNTRACKED_MESSAGE_TYPES if t not in shown)]
    return True
