"""Where the JupyterLab extension is installed, the one line that says how to get it when it is not, and what
nbscale's Jupyter server extension tells the kernels its server starts.

A checkout installed without Node leaves the extension out (hatch_build.py, docs/install.md): nbscale works, and
JupyterLab shows no status bar item or panel. `nbscale doctor` and the Jupyter server's log say so with this line.
"""

from __future__ import annotations

import json
from pathlib import Path

# Set (`1`) by the server extension in its server's environment, which the kernels it starts inherit: there a widget
# message handled mid-cell leaves the kernel's status Busy (nbscale.server), so they draw live figures in the browser
# (nbscale.ui.widget_front_end).
STATUS_KEPT_VARIABLE = "NBSCALE_SERVER_KEEPS_KERNEL_STATUS"

NOT_INSTALLED = (
    "the JupyterLab extension (status bar and panel) is not installed: this nbscale was installed without Node. "
    "Install Node.js 20+ and reinstall, or install a wheel made by `make wheel` (docs/install.md)."
)


def installed_lab_extension() -> tuple[Path, str] | None:
    """The folder of the installed extension and its version, or None when JupyterLab would not find it."""
    from jupyter_core.paths import jupyter_path

    for folder in jupyter_path("labextensions"):
        package = Path(folder, "nbscale", "package.json")
        if package.is_file():
            version = json.loads(package.read_text(encoding="utf-8")).get("version", "?")
            return package.parent, str(version)
    return None
