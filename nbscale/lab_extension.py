"""Where the JupyterLab extension is installed, and the one line that says how to get it when it is not.

A checkout installed without Node leaves the extension out (hatch_build.py, docs/install.md): nbscale works, and
JupyterLab shows no status bar item or panel. `nbscale doctor` and the Jupyter server's log say so with this line.
"""

from __future__ import annotations

import json
from pathlib import Path

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
