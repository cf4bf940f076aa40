"""End to end: a real JupyterLab on loopback, Debian's headless Chromium driven by Playwright.

Open a notebook, start a pool of 2 CPU workers, see the status bar say so, open the panel, see the workers.
The screenshot goes to tests/artifacts/; with NBSCALE_UPDATE_SCREENSHOT=1 it rewrites docs/screenshot-panel.png
(the README shows it).
"""

from __future__ import annotations

import contextlib
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
from typing import Any

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
# a small in-notebook training, long enough (200 epochs) to be stopped from its Stop button
TRAINING_CELLS = [
    "%load_ext nbscale",
    """import torch, nbscale
from torch import nn
x = torch.randn(2000, 20); y = (x[:, 0] > 0).long()
data = torch.utils.data.TensorDataset(x, y)
opts = nbscale.TrainingOptions("sgdm", max_epochs=200, mini_batch_size=32, plots="training-progress", verbose=False,
                               validation_data=data, validation_frequency=50)
net, info = nbscale.train(nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2)), data, opts)
print("returned", type(net).__name__, "·", info.stop_reason)""",
]
# a detached job that trains for minutes unless cancelled
JOB_CELLS = [
    "%load_ext nbscale",
    """%%batch --name demo
import torch, nbscale
from torch import nn
x = torch.randn(2000, 20); y = (x[:, 0] > 0).long()
opts = nbscale.TrainingOptions("sgdm", max_epochs=2000, mini_batch_size=32, verbose=False, plots="none")
net, info = nbscale.train(nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2)), (x, y), opts)""",
]
# the options form, then %%train with it (a tiny network; 1 epoch once the form says so)
FORM_CELLS = [
    "%load_ext nbscale",
    """import torch, nbscale
from torch import nn
form = nbscale.options_form()""",
    """%%train --options form
model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2))
x = torch.randn(512, 20)
train_data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())""",
]
NOTEBOOKS = {"pool.ipynb": CELLS, "training.ipynb": TRAINING_CELLS, "jobs.ipynb": JOB_CELLS, "form.ipynb": FORM_CELLS}


class Lab:
    """A running JupyterLab: `url(notebook)` opens one of NOTEBOOKS; `stop()` ends the server (and its kernels)."""

    def __init__(self, base: str, token: str, server: subprocess.Popen) -> None:
        self.base, self.token, self.server = base, token, server

    def url(self, notebook: str = "pool.ipynb") -> str:
        return f"{self.base}/lab/tree/{notebook}?reset&token={self.token}"

    def stop(self) -> None:
        if self.server.poll() is not None:
            return
        self.server.send_signal(signal.SIGINT)  # the server shuts its kernels down (and so their pools)
        try:
            self.server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.server.send_signal(signal.SIGINT)  # JupyterLab asks to confirm; a second interrupt stops it
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server.kill()


BUILT = REPO / "nbscale" / "labextension"  # this checkout's build (`npm run build` in labextension/)


def _extension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return (BUILT / "package.json").is_file() or any(
        (Path(folder) / "nbscale" / "package.json").is_file() for folder in jupyter_path("labextensions")
    )


def _serve_this_checkouts_build(tmp_path: Path) -> dict[str, str]:
    """Environment that makes JupyterLab load this checkout's extension build, where it has one, before any
    other installed copy (JUPYTER_PATH comes first, and the first copy of an extension found wins), so the
    test checks the TypeScript beside it even when the environment links another checkout's build."""
    if not (BUILT / "package.json").is_file():
        return {}
    data = tmp_path / "jupyter-path"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "nbscale").symlink_to(BUILT)
    return {"JUPYTER_PATH": os.pathsep.join(filter(None, [str(data), os.environ.get("JUPYTER_PATH")]))}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A JupyterLab server on 127.0.0.1 with a random token, its own config, runtime and job folders."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    if not _extension_installed():
        pytest.skip("nbscale's labextension is not built and linked: `make venv` does it")
    token = secrets.token_hex(16)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name, cells in NOTEBOOKS.items():
        (notebooks / name).write_text(
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
        "NBSCALE_HOME": str(tmp_path / "nbscale-home"),  # this test's own job store
        **_serve_this_checkouts_build(tmp_path),
    }
    log = open(tmp_path / "server.log", "wb")  # closed when the server has stopped
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", "--port=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}", "--LabApp.expose_app_in_browser=True", *root],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
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
    running = Lab(url, token, server)
    try:
        yield running
    finally:
        running.stop()
        log.close()


def _run_cell(page, index: int, cells: list[str] = CELLS, wait: bool = True) -> Any:
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


def test_status_bar_and_panel_show_the_notebooks_pool(lab: Lab):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 820})
            page.goto(lab.url())
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


@contextlib.contextmanager
def _notebook_page(lab: Lab, notebook: str, failure_name: str) -> Iterator[Any]:
    """A Chromium page with `notebook` open and its kernel ready; on a failure, its picture is kept as
    `<failure_name>-failure.png` in ARTIFACTS."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = _open_notebook(browser, lab, notebook)
        try:
            yield page
        except BaseException:
            _failure_picture(page, failure_name)
            raise
        finally:
            browser.close()


def _open_notebook(browser, lab: Lab, notebook: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 820})
    page.goto(lab.url(notebook))
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    return page


def _failure_picture(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # what the browser showed, for the failure report
    page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"))


def _inside(inner: Any, outer: Any) -> bool:
    """Whether `inner` lies wholly inside `outer` on the screen (not cut off by its edges)."""
    a, b = inner.bounding_box(), outer.bounding_box()
    return (a is not None and b is not None and a["x"] >= b["x"] and a["x"] + a["width"] <= b["x"] + b["width"] + 0.5
            and a["y"] >= b["y"] and a["y"] + a["height"] <= b["y"] + b["height"] + 0.5)


def test_the_status_bar_survives_a_page_reload_and_a_kernel_restart_and_the_panel_stops_a_pool(lab: Lab):
    from playwright.sync_api import expect

    with _notebook_page(lab, "pool.ipynb", "reload-restart") as page:
        _run_cell(page, 0)
        _run_cell(page, 1)
        status = page.locator(".nbscale-StatusItem")
        expect(status).to_contain_text("2 workers", timeout=30_000)

        page.reload()  # same kernel, new page: the status bar finds its pool again
        page.wait_for_function(KERNEL_READY, timeout=90_000)
        expect(status).to_contain_text("2 workers · 0 busy", timeout=30_000)

        page.evaluate("() => { void window.jupyterapp.commands.execute('kernelmenu:restart'); }")  # asks first
        page.locator(".jp-Dialog button.jp-mod-accept").click()  # "Restart"
        expect(status).to_be_hidden(timeout=30_000)  # the pool died with its kernel
        page.wait_for_function(KERNEL_READY, timeout=90_000)
        page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
        pools = page.locator(".nbscale-pools")
        expect(pools).to_contain_text("No pool is running", timeout=15_000)

        _run_cell(page, 0)  # the restarted kernel starts a pool again
        _run_cell(page, 1)
        expect(status).to_contain_text("2 workers", timeout=30_000)
        stop = pools.get_by_role("button", name="Stop pool")
        stop.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Stop the pool of this notebook?")
        dialog.get_by_role("button", name="Keep it").click()
        time.sleep(4)  # a refresh later, it still runs
        expect(status).to_contain_text("2 workers")
        stop.click()
        dialog.get_by_role("button", name="Stop pool").click()
        expect(status).to_be_hidden(timeout=30_000)
        expect(pools).to_contain_text("No pool is running", timeout=15_000)


def test_a_training_cell_draws_its_figure_and_info_panel_and_stop_returns_the_net(lab: Lab):
    from playwright.sync_api import expect

    with _notebook_page(lab, "training.ipynb", "training") as page:
        _run_cell(page, 0, TRAINING_CELLS)
        cell = _run_cell(page, 1, TRAINING_CELLS, wait=False)
        info = cell.locator(".jp-OutputArea-output table")
        expect(info).to_contain_text("Training", timeout=120_000)
        expect(info).to_contain_text("Iteration")
        figure = cell.locator(".jp-OutputArea-output img")  # a picture, not "<training progress figure>"
        expect(figure).to_be_visible(timeout=30_000)
        assert figure.evaluate("img => img.naturalWidth") > 300
        stop = cell.locator("button", has_text="Stop")
        expect(stop).to_be_enabled()
        time.sleep(1.5)  # past the Stop button's subshell request, whose idle once made the status bar say Idle
        expect(page.locator(".jp-StatusBar-TextItem", has_text="Python 3")).to_contain_text("Busy")
        cell.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "training-progress.png"))
        stop.click()
        expect(cell.locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=60_000)
        expect(cell.locator(".jp-OutputArea")).to_contain_text("returned Sequential · Stopped by the Stop button")
        expect(info).to_contain_text("Done: Stopped by the Stop button")
        expect(stop).to_have_count(0)  # no dead button left in the notebook
        expect(figure).to_be_visible()


def test_the_panel_shows_a_running_jobs_training_and_its_buttons_and_cancel_asks_first(lab: Lab):
    from playwright.sync_api import expect

    with _notebook_page(lab, "jobs.ipynb", "jobs") as page:
        _run_cell(page, 0, JOB_CELLS)
        _run_cell(page, 1, JOB_CELLS)
        page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
        panel = page.locator(".nbscale-Panel")
        job = panel.locator(".nbscale-Job").first
        expect(job).to_contain_text("demo", timeout=15_000)
        training = panel.locator(".nbscale-Job-training .nbscale-Bar-label")
        expect(training).to_contain_text("epoch", timeout=120_000)
        expect(training).to_contain_text("left")
        buttons = panel.locator(".nbscale-Job-actions button")
        expect(buttons).to_have_text(["Log", "Cancel", "Copy"])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "panel-jobs.png"))
        for shown in [training, *buttons.all()]:  # in the sidebar as it opens, not off its right edge
            assert _inside(shown, panel), f"{shown.inner_text()!r} is cut off by the panel's edge"

        cancel = buttons.filter(has_text="Cancel")
        cancel.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Cancel job 1 'demo'?")
        dialog.get_by_role("button", name="Keep running").click()
        expect(dialog).to_have_count(0)
        time.sleep(4)  # a refresh later, it still runs
        expect(job.locator(".nbscale-State")).to_have_text("running")

        cancel.click()
        dialog.get_by_role("button", name="Cancel job").click()
        expect(job.locator(".nbscale-State")).to_have_text("cancelled", timeout=30_000)
        expect(panel.locator(".nbscale-Job-actions button")).to_have_text(["Log", "Copy"])


def test_the_panel_says_so_when_the_server_cannot_be_reached(lab: Lab):
    from playwright.sync_api import expect

    with _notebook_page(lab, "pool.ipynb", "server-gone") as page:
        page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
        panel = page.locator(".nbscale-Panel")
        expect(panel.locator(".nbscale-pools")).to_contain_text("No pool is running", timeout=15_000)
        expect(panel.locator(".nbscale-Error")).to_have_count(0)
        lab.stop()
        error = panel.locator(".nbscale-Error").first
        expect(error).to_contain_text("Cannot reach nbscale's server extension", timeout=30_000)
        expect(error).to_contain_text("Below: what it said at")  # the sections below are its last answer
        expect(panel.locator("section.nbscale-Stale")).to_have_count(3)
        page.screenshot(path=str(ARTIFACTS / "panel-server-gone.png"))


def test_the_options_form_shows_every_group_an_error_beside_its_field_and_train_uses_it(lab: Lab):
    from playwright.sync_api import expect

    with _notebook_page(lab, "form.ipynb", "options-form") as page:
        _run_cell(page, 0, FORM_CELLS)
        form = _run_cell(page, 1, FORM_CELLS).locator(".jp-OutputArea-output")
        tabs = form.get_by_role("tab")
        expect(tabs).to_have_text(["Solver", "Learning rate", "Data & batches", "Validation", "Loss & metrics", "Hardware",
                                  "Output"])
        expect(form).to_contain_text("Valid training options")

        threshold = form.locator(".widget-text", has_text="gradient_threshold").first
        threshold.locator("input").fill("abc")
        message = form.get_by_text("TrainingOptions.gradient_threshold: write a number or inf")
        expect(message).to_be_visible()
        field, said = threshold.locator("input").bounding_box(), message.bounding_box()
        assert said["x"] >= field["x"] + field["width"] and abs(said["y"] - field["y"]) < field["height"], (
            f"the message is not beside its field: field {field}, message {said}")
        expect(form).to_contain_text("1 wrong value(s)")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "options-form-error.png"))

        train = _run_cell(page, 2, FORM_CELLS)
        expect(train.locator(".jp-OutputArea")).to_contain_text("gradient_threshold")
        expect(train.locator(".jp-OutputArea")).to_contain_text("nothing was run")

        threshold.locator("input").fill("inf")
        tabs.filter(has_text="Data & batches").click()
        epochs = form.locator(".widget-text", has_text="max_epochs").locator("input")
        epochs.fill("1")
        epochs.press("Tab")  # a number box sends its value when it loses focus
        expect(form).to_contain_text("Valid training options")
        page.keyboard.press("Escape")
        train.locator(".jp-InputPrompt").click()
        page.keyboard.press("Shift+Enter")
        expect(train.locator(".jp-InputPrompt")).to_have_text("[4]:", timeout=120_000)
        expect(train.locator(".jp-OutputArea-output table")).to_contain_text("Epoch1 of 1")
        expect(train.locator(".jp-OutputArea-output img")).to_be_visible()  # plots="training-progress" by default
