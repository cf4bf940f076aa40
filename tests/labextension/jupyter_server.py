"""What the browser tests share: a real Jupyter server on loopback (JupyterLab or Notebook 7) serving this
checkout's extension build, Debian's headless Chromium driven by Playwright, and the pictures the tests take.

Pictures go to tests/artifacts/; with NBSCALE_WRITE_SCREENSHOTS=1 (`make screenshots`) the ones the docs show are
written into docs/ instead, cropped to the element they show.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
EXPECT_TIMEOUT_MS = 30_000
ARTIFACTS = REPO / "tests" / "artifacts"
DOCS = REPO / "docs"
# the docs' pictures are rewritten only on request, so `make test` leaves the tree clean
WRITE_SCREENSHOTS = os.environ.get("NBSCALE_WRITE_SCREENSHOTS") == "1"
MAX_PICTURE_BYTES = 150_000  # a docs page stays quick to load
# the notebook's kernel is started, connected and idle (window.jupyterapp: expose_app_in_browser)
KERNEL_READY = """() => {
    const kernel = window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel;
    return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""
BUILT = REPO / "nbscale" / "labextension"  # this checkout's build (`npm run build` in labextension/)


class Server:
    """A running Jupyter server (JupyterLab's or Notebook 7's): `url(notebook)` opens a notebook, `tree_url()`
    Notebook 7's file browser; `stop()` ends the server (and its kernels)."""

    def __init__(self, app: str, base: str, token: str, server: subprocess.Popen) -> None:
        self.app, self.base, self.token, self.server = app, base, token, server

    def url(self, notebook: str) -> str:
        if self.app == "notebook":
            return f"{self.base}/notebooks/{notebook}?token={self.token}"
        return f"{self.base}/lab/tree/{notebook}?reset&token={self.token}"

    def tree_url(self) -> str:
        return f"{self.base}/tree?token={self.token}"

    def stop(self) -> None:
        if self.server.poll() is not None:
            return
        # SIGTERM: the server stops and shuts its kernels down (and so their pools). SIGINT is not used: a process
        # started in the background by a non-interactive shell ignores it, and JupyterLab asks to confirm one.
        end_server(self.server, wait_s=20)


def end_server(server: subprocess.Popen[Any], wait_s: float) -> None:
    """SIGTERM a Jupyter server and wait `wait_s` for it; SIGKILL it if it has not ended (a busy machine's server
    can take longer), so none is left running."""
    server.terminate()
    try:
        server.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=wait_s)


def _extension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return (BUILT / "package.json").is_file() or any(
        (Path(folder) / "nbscale" / "package.json").is_file() for folder in jupyter_path("labextensions")
    )


def _serve_this_checkouts_build(tmp_path: Path) -> dict[str, str]:
    """Environment that makes the server load this checkout's extension build, where it has one, before any
    other installed copy (JUPYTER_PATH comes first, and the first copy of an extension found wins), so the
    test checks the TypeScript beside it even when the environment links another checkout's build."""
    if not (BUILT / "package.json").is_file():
        return {}
    data = tmp_path / "jupyter-path"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "nbscale").symlink_to(BUILT)
    return {"JUPYTER_PATH": os.pathsep.join(filter(None, [str(data), os.environ.get("JUPYTER_PATH")]))}


def _write_notebook(path: Path, cells: list[str]) -> None:
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}
                    for code in cells
                ],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


@contextlib.contextmanager
def jupyter_server(
    tmp_path: Path, notebooks: dict[str, list[str]], app: str = "jupyterlab", env: dict[str, str] | None = None
) -> Iterator[Server]:
    """A Jupyter server (`app`: "jupyterlab" or "notebook") on 127.0.0.1 with a random token, its own config,
    runtime and job folders, serving `notebooks` (name: cells); `env` is added to its (and its kernels')
    environment."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    if not _extension_installed():
        pytest.skip("nbscale's labextension is not built and linked: `make venv` does it")
    token = secrets.token_hex(16)
    root_dir = tmp_path / "notebooks"
    root_dir.mkdir()
    for name, cells in notebooks.items():
        _write_notebook(root_dir / name, cells)
    notification_settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notification_settings.mkdir(parents=True)  # no news toast over the screenshot (and no internet to fetch it)
    (notification_settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    root = ["--allow-root"] if os.geteuid() == 0 else []
    expose = "LabApp" if app == "jupyterlab" else "JupyterNotebookApp"
    server_env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "NBSCALE_RUNTIME_DIR": str(tmp_path / "nbscale"),  # pools publish here; the server reads here
        "NBSCALE_HOME": str(tmp_path / "nbscale-home"),  # this test's own job store
        **_serve_this_checkouts_build(tmp_path),
        **(env or {}),
    }
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", "--port=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
         f"--{expose}.expose_app_in_browser=True",
         *root],
        env=server_env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    info_file = tmp_path / "runtime" / f"jpserver-{server.pid}.json"  # names the port the OS gave (--port=0)
    deadline = time.monotonic() + 90
    while True:
        try:
            url = f"http://127.0.0.1:{json.loads(info_file.read_text())['port']}"
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except (OSError, ValueError, KeyError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"{app} did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.3)
    running = Server(app, url, token, server)
    try:
        yield running
    finally:
        running.stop()
        log.close()


def run_cell(page: Any, index: int, cells: list[str], wait: bool = True) -> Any:
    """Run cell `index` (0-based) of the notebook holding `cells` as the user would, and (unless `wait` is False)
    wait until the kernel has run it; the cell's locator.

    The cells are in the file rather than typed: typing into a notebook that is still loading can be undone
    when the server's copy of the document arrives.
    """
    from playwright.sync_api import expect

    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    expect(cell.locator(".cm-content")).to_have_text(cells[index].replace("\n", ""))
    cell.locator(".jp-InputPrompt").click()  # select the cell (command mode)
    page.keyboard.press("Shift+Enter")
    if wait:
        expect(cell.locator(".jp-InputPrompt")).to_have_text(f"[{index + 1}]:", timeout=120_000)
    return cell


def open_notebook(browser: Any, server: Server, notebook: str) -> Any:
    """A new page with `notebook` open and its kernel ready."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # tall enough for a figure with its panel
    page.goto(server.url(notebook))
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    return page


def failure_picture(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # what the browser showed, for the failure report
    page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"))


@contextlib.contextmanager
def notebook_page(server: Server, notebook: str, failure_name: str) -> Iterator[Any]:
    """A Chromium page with `notebook` open and its kernel ready; on a failure, its picture is kept as
    `<failure_name>-failure.png` in ARTIFACTS."""
    from playwright.sync_api import expect, sync_playwright

    # Playwright's default wait for an expected state is 5 s: a page beside the whole suite on 2 cores took longer
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = open_notebook(browser, server, notebook)
        try:
            yield page
        except BaseException:
            failure_picture(page, failure_name)
            raise
        finally:
            browser.close()


def docs_picture(element: Any, name: str, down_to: Any = None) -> Path:
    """A picture of `element` alone (cropped to it, or, for a tall sidebar, down to the bottom of `down_to`
    inside it): docs/<name> with NBSCALE_WRITE_SCREENSHOTS=1, else tests/artifacts/<name>; a docs picture must
    stay under MAX_PICTURE_BYTES."""
    path = (DOCS if WRITE_SCREENSHOTS else ARTIFACTS) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if down_to is None:
        element.screenshot(path=str(path), animations="disabled")
    else:
        box, last = element.bounding_box(), down_to.bounding_box()
        height = last["y"] + last["height"] + 8 - box["y"]
        element.page.screenshot(path=str(path), animations="disabled", clip={**box, "height": height})
    size = path.stat().st_size
    assert not WRITE_SCREENSHOTS or size <= MAX_PICTURE_BYTES, f"{path} is {size:,} bytes: crop it to less"
    return path
