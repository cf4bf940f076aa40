"""Build hook: put the JupyterLab extension in the wheel when it is built or can be built, else leave it out.

- nbscale/labextension/ already built (the sdist, a checkout after `make wheel` or `make venv`): shipped as it is.
- Not built, npm on PATH: built with npm (labextension/, hatch-jupyter-builder's npm_builder), then shipped.
- Not built, no npm: the Python package installs without it and the build prints LEFT_OUT (pip shows it with -v;
  `nbscale doctor` and the Jupyter server's log say the same at run time). docs/install.md says why.

`NBSCALE_REQUIRE_LABEXTENSION=1` (set by `make wheel`) turns the missing extension into a build error instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUILT = "nbscale/labextension"
TARGETS = ("static/style.js", "package.json", "install.json")
SHARE = "share/jupyter/labextensions/nbscale"
LEFT_OUT = (
    "nbscale: the JupyterLab extension (status bar and panel) was left out of this install: no npm on PATH to "
    "build it. Install Node.js 20+ and reinstall, or install a wheel made by `make wheel` (docs/install.md)."
)


class LabExtensionHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name not in ("wheel", "sdist"):
            return
        root = Path(self.root)
        if shutil.which("npm") and (version == "editable" or not _built(root)):
            _build_with_npm(self.target_name, version)
        if _built(root):  # the sdist carries the built folder; the wheel, its copy where JupyterLab looks
            if self.target_name == "sdist":
                build_data["artifacts"].append(f"/{BUILT}")
            else:
                build_data["shared_data"][BUILT] = SHARE
            return
        if os.environ.get("NBSCALE_REQUIRE_LABEXTENSION") == "1":
            raise RuntimeError(f"{LEFT_OUT} (NBSCALE_REQUIRE_LABEXTENSION=1: a release wheel must carry it)")
        print(LEFT_OUT, file=sys.stderr)


def _built(root: Path) -> bool:
    return all((root / BUILT / target).is_file() for target in TARGETS)


def _build_with_npm(target_name: str, version: str) -> None:
    from hatch_jupyter_builder import npm_builder

    if version == "editable":  # `make venv`: a development build (when src/ changed), linked by `labextension develop`
        kwargs = {"build_cmd": "install:extension", "source_dir": "labextension/src", "build_dir": BUILT}
        npm_builder(target_name, version, path="labextension", npm=["npm"], **kwargs)
    else:
        npm_builder(target_name, version, path="labextension", npm=["npm"], build_cmd="build:prod")
