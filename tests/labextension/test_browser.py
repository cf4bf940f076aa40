"""End to end: a real JupyterLab on loopback, Debian's headless Chromium driven by Playwright.

Open a notebook, start a pool of 2 CPU workers, see the status bar say so, open the panel, see the workers.
The screenshot goes to tests/artifacts/; with NBSCALE_UPDATE_SCREENSHOT=1 it rewrites docs/screenshot-panel.png (the README shows it).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbscale

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO / "tests" / "artifacts"
# the README's picture is rewritten only on request, so `make test` leaves the tree clean
SCREENSHOT = (
    REPO / "docs" / "screenshot-panel.png" if os.environ.get("NBSCALE_UPDATE_SCREENSHOT") else ARTIFACTS / "screenshot-panel.png"
)
# the notebook's kernel is started, connected and idle (window.jupyterapp: --LabApp.expose_app_in_browser)
KERNEL_READY = """() => {
    const kernel = window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel;
    return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""
CELLS = ["%load_ext nbscale", "%pool start 2 --cpu", "%pool stop"]


def _extension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any((Path(folder) / "nbscale" / "package.json").is_file() for folder in jupyter_path("labextensions"))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 with a random token, its own config and runtime folders; its URL."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    if not _extension_installed():
        pytest.skip("nbscale's labextension is not built and linked: `make venv` does it")
    token = secrets.token_hex(16)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "pool.ipynb").write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}
                    for code in CELLS
                ],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    notification_settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notification_settings.mkdir(parents=True)  # no news toast over the screenshot (and no internet to fetch it)
    (notification_settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    root = ["--allow-root"] if os.geteuid() == 0 else []
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "NBSCALE_RUNTIME_DIR": str(tmp_path / "nbscale"),  # pools publish here; the server reads here
    }
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed when the server has stopped
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", "--port=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}", "--LabApp.expose_app_in_browser=True", *root],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
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
                pytest.fail("JupyterLab did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.3)
    try:
        yield f"{url}/lab/tree/pool.ipynb?reset&token={token}"
    finally:
        server.send_signal(signal.SIGINT)  # the server shuts its kernels down (and so their pools)
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.send_signal(signal.SIGINT)  # JupyterLab asks to confirm; a second interrupt stops it
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()


def _run_cell(page, index: int) -> None:
    """Run cell `index` (0-based; they hold CELLS) as the user would, and wait until the kernel has run it.

    The cells are in the file rather than typed: typing into a notebook that is still loading can be undone
    when the server's copy of the document arrives.
    """
    from playwright.sync_api import expect

    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    expect(cell.locator(".cm-content")).to_have_text(CELLS[index])
    cell.locator(".jp-InputPrompt").click()  # select the cell (command mode)
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-InputPrompt")).to_have_text(f"[{index + 1}]:", timeout=120_000)


def test_status_bar_and_panel_show_the_notebooks_pool(lab: str):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 820})
            page.goto(lab)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            page.wait_for_function(KERNEL_READY, timeout=90_000)

            _run_cell(page, 0)
            _run_cell(page, 1)
            try:
                expect(page.locator(".jp-OutputArea-output").last).to_contain_text(
                    "Started 2 CPU workers", timeout=120_000
                )
            except AssertionError:
                shown = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
                raise AssertionError(f"%pool start 2 --cpu did not start a pool; the notebook shows:\n{shown}") from None

            status = page.locator(".nbscale-StatusItem")
            expect(status).to_contain_text("2 workers", timeout=30_000)
            status.click()

            panel = page.locator(".nbscale-Panel")
            expect(panel).to_be_visible()
            workers = panel.locator(".nbscale-pools .nbscale-Worker")
            expect(workers).to_have_count(2, timeout=15_000)
            expect(workers.first.locator("td").first).to_have_text("0")
            expect(panel.locator(".nbscale-Pool-title").first).to_contain_text("this notebook")
            if not nbscale.gpus():
                expect(panel.locator(".nbscale-NoGpu")).to_contain_text("No GPU")
            try:  # for the picture only: memory shows once a heartbeat carries the workers' replies
                expect(workers.first.locator("td").last).to_contain_text("MB", timeout=10_000)
            except AssertionError:
                pass
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))

            _run_cell(page, 2)
            expect(status).to_be_hidden(timeout=30_000)  # the pool withdrew its registry file
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)  # what the browser showed, for the failure report
            page.screenshot(path=str(ARTIFACTS / "labextension-failure.png"))
            raise
        finally:
            browser.close()
