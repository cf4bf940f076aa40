"""End to end: a real JupyterLab on loopback, Debian's headless Chromium driven by Playwright.

Open a notebook, start a pool of 2 CPU workers, see the status bar say so, open the panel, see the workers; a
training's figure, a job and its monitor, the options form, the %gpu table. With NBSCALE_WRITE_SCREENSHOTS=1
(`make screenshots`) the tests write the docs' pictures (docs/screenshot-*.png); otherwise they check that the
page shows the same elements and keep their pictures in tests/artifacts/.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbscale
from tests.kernel_session import KernelSession, needs_clicks_mid_cell
from tests.labextension.jupyter_server import (
    ARTIFACTS,
    KERNEL_READY,
    Server,
    docs_picture,
    jupyter_server,
    notebook_page,
    run_cell,
)
from tests.nvml_probe import FAKE_NVML_DIR

pytestmark = pytest.mark.slow

# the first cell prints a line as wide as a verbose table's row with many metrics (wider than the page)
CELLS = ["%load_ext nbscale\nprint('| row ' * 80)", "%pool start 2 --cpu", "%pool stop"]
# a training on scikit-learn's digits, 150 epochs: the picture at 20%, then its Stop button ends it
TRAINING_CELLS = [
    "%load_ext nbscale",
    """import time, torch, nbscale
from torch import nn
from sklearn.datasets import load_digits
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16; y = torch.tensor(digits.target)
data = torch.utils.data.TensorDataset(x[:1500], y[:1500])
opts = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, max_epochs=150, mini_batch_size=64,
                               plots="training-progress", verbose=False,
                               validation_data=torch.utils.data.TensorDataset(x[1500:], y[1500:]),
                               validation_frequency=10,
                               output_fn=lambda info: time.sleep(0.02))  # >= 20 ms an iteration, on any machine
net, info = nbscale.train(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), data, opts)
print("returned", type(net).__name__, "·", info.stop_reason)""",
]
# a pool, a detached job that trains for minutes unless cancelled (37,500 iterations), and its monitor
JOB_CELLS = [
    "%load_ext nbscale",
    "%pool start 2 --cpu",
    """%%batch --name demo
import torch, nbscale
from torch import nn
x = torch.randn(20000, 20); y = (x[:, 0] > 0).long()
opts = nbscale.TrainingOptions("sgdm", max_epochs=60, mini_batch_size=32, verbose=False, plots="none")
net, info = nbscale.train(nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2)), (x, y), opts)""",
    "%jobs show 1",
]
# the options form (a piecewise schedule, so its preview shows the drops), then %%train with it
FORM_CELLS = [
    "%load_ext nbscale",
    """import torch, nbscale
from torch import nn
form = nbscale.options_form(nbscale.TrainingOptions("sgdm", learn_rate_schedule="piecewise", learn_rate_drop_period=4,
                                                    max_epochs=12, plots="training-progress"))""",
    """%%train --options form
model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2))
x = torch.randn(512, 20)
train_data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())""",
]
NOTEBOOKS = {"pool.ipynb": CELLS, "training.ipynb": TRAINING_CELLS, "jobs.ipynb": JOB_CELLS, "form.ipynb": FORM_CELLS}
# two stand-in GPUs (tests/fake_nvml); GPU 0 is held by another notebook's pool plan
GPU_CELLS = ["%load_ext nbscale", "%gpu"]
# what %pool start does first in that other notebook: choose and reserve a free GPU (no workers: no CUDA here)
RESERVE_A_GPU = """
from nbscale.pool.backends.local import LocalBackend
from nbscale.pool.settings import PoolSettings
backend = LocalBackend()
plan = backend.plan(PoolSettings(1))
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Server]:
    """A JupyterLab server serving NOTEBOOKS (see tests/labextension/jupyter_server.py)."""
    with jupyter_server(tmp_path, NOTEBOOKS) as server:
        yield server


@pytest.fixture(params=["jupyterlab", "notebook"])
def lab_or_notebook7(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """JupyterLab, then Notebook 7 (`jupyter notebook`), serving the pool notebook."""
    with jupyter_server(tmp_path, {"pool.ipynb": CELLS}, app=request.param) as server:
        yield server


def test_status_bar_and_panel_show_the_notebooks_pool(lab_or_notebook7: Server):
    """In JupyterLab the item sits in the status bar, in Notebook 7 (which has none) in the notebook's header;
    in both it opens the panel, in the right sidebar."""
    from playwright.sync_api import expect

    server = lab_or_notebook7
    with notebook_page(server, "pool.ipynb", f"pool-{server.app}") as page:
        run_cell(page, 0, CELLS)
        printed = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout'] pre").first
        expect(printed).to_contain_text("| row | row", timeout=30_000)
        shown = printed.evaluate("e => [getComputedStyle(e).whiteSpace, e.scrollWidth > e.clientWidth]")
        assert shown == ["pre", True], f"a printed row wider than the page wraps, or cannot be scrolled to: {shown}"
        run_cell(page, 1, CELLS)
        try:
            expect(page.locator(".jp-OutputArea-output").last).to_contain_text("Started 2 CPU workers", timeout=120_000)
        except AssertionError:
            shown = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
            raise AssertionError(f"%pool start 2 --cpu did not start a pool; the notebook shows:\n{shown}") from None

        status = page.locator(".nbscale-StatusItem")
        expect(status).to_contain_text("2 workers", timeout=30_000)
        where = ".jp-StatusBar-Widget" if server.app == "jupyterlab" else "#top-panel"
        expect(page.locator(where).locator(".nbscale-StatusItem")).to_be_visible()
        status.click()

        panel = page.locator(".nbscale-Panel")
        expect(panel).to_be_visible()
        workers = panel.locator(".nbscale-pools .nbscale-Worker")
        expect(workers).to_have_count(2, timeout=15_000)
        expect(workers.first.locator("td").first).to_have_text("0")
        expect(panel.locator(".nbscale-Pool-title").first).to_contain_text("this notebook")
        if not nbscale.gpus():
            expect(panel.locator(".nbscale-NoGpu")).to_contain_text("No GPU")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"pool-panel-{server.app}.png"))

        if server.app == "notebook":  # Notebook 7's file browser: the panel opens there too, from its command
            tree = page.context.browser.new_page(viewport={"width": 1400, "height": 820})
            tree.goto(server.tree_url())
            tree.wait_for_function("() => window.jupyterapp?.commands.hasCommand('nbscale:open-panel')", timeout=60_000)
            tree.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
            tree_panel = tree.locator(".nbscale-Panel")
            expect(tree_panel).to_be_visible()
            expect(tree_panel.locator(".nbscale-pools .nbscale-Worker")).to_have_count(2, timeout=15_000)
            # no notebook in front: the pool is named by its notebook (Jupyter's session path), not "kernel 1a2b3c4d"
            expect(tree_panel.locator(".nbscale-Pool-title").first).to_contain_text("· pool.ipynb")
            expect(tree.locator(".nbscale-StatusItem")).to_be_hidden()  # no notebook in front, no pool of its own
            tree.close()

        run_cell(page, 2, CELLS)
        expect(status).to_be_hidden(timeout=30_000)  # the pool withdrew its registry file


def _inside(inner: Any, outer: Any) -> bool:
    """Whether `inner` lies wholly inside `outer` on the screen (not cut off by its edges)."""
    a, b = inner.bounding_box(), outer.bounding_box()
    return (
        a is not None
        and b is not None
        and a["x"] >= b["x"]
        and a["x"] + a["width"] <= b["x"] + b["width"] + 0.5
        and a["y"] >= b["y"]
        and a["y"] + a["height"] <= b["y"] + b["height"] + 0.5
    )


def test_the_status_bar_survives_a_page_reload_and_a_kernel_restart_and_the_panel_stops_a_pool(lab: Server):
    from playwright.sync_api import expect

    with notebook_page(lab, "pool.ipynb", "reload-restart") as page:
        run_cell(page, 0, CELLS)
        run_cell(page, 1, CELLS)
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

        run_cell(page, 0, CELLS)  # the restarted kernel starts a pool again
        run_cell(page, 1, CELLS)
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


@needs_clicks_mid_cell
def test_a_training_cell_draws_its_figure_and_info_panel_and_stop_returns_the_net(lab: Server):
    from playwright.sync_api import expect

    with notebook_page(lab, "training.ipynb", "training") as page:
        run_cell(page, 0, TRAINING_CELLS)
        cell = run_cell(page, 1, TRAINING_CELLS, wait=False)
        info = cell.locator(".jp-OutputArea-output table")
        expect(info).to_contain_text("Training", timeout=120_000)
        expect(info).to_contain_text("Iteration")
        # drawn in the browser: the kernels of a server with nbscale's extension hear the Stop button's view
        figure = cell.locator("canvas.nbscale-live-figure")
        expect(figure).to_be_visible(timeout=30_000)
        assert figure.evaluate("canvas => canvas.width") > 300
        stop = cell.locator("button", has_text="Stop")
        expect(stop).to_be_enabled()
        time.sleep(1.5)  # past the subshell's requests and the views' messages, whose idle once said Idle
        expect(page.locator(".jp-StatusBar-TextItem", has_text="Python 3")).to_contain_text("Busy")
        expect(info).to_contain_text(re.compile(r"Epoch\s*([3-9]\d|1\d\d) of 150"), timeout=180_000)  # curves to show
        output = cell.locator(".jp-OutputArea")
        output.scroll_into_view_if_needed()
        docs_picture(output, "screenshot-training.png")  # the figure, its info panel and Stop button, mid-run
        stop.click()
        expect(cell.locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=60_000)
        expect(cell.locator(".jp-OutputArea")).to_contain_text("returned Sequential · Stopped by the Stop button")
        expect(info).to_contain_text("Done: Stopped by the Stop button")
        expect(stop).to_have_count(0)  # no dead button left in the notebook
        expect(figure).to_have_count(0)
        expect(cell.locator(".jp-OutputArea-output img")).to_be_visible()  # the final figure, a PNG


def test_the_panel_shows_a_running_jobs_training_and_its_buttons_and_cancel_asks_first(lab: Server):
    from playwright.sync_api import expect

    with notebook_page(lab, "jobs.ipynb", "jobs") as page:
        for index in range(4):  # the extension, a pool of 2, the job, its monitor (which follows in the background)
            run_cell(page, index, JOB_CELLS)
        pool_output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea")
        expect(pool_output).to_contain_text("Started 2 CPU workers", timeout=120_000)
        page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
        panel = page.locator(".nbscale-Panel")
        job = panel.locator(".nbscale-Job").first
        expect(job).to_contain_text("demo", timeout=15_000)
        training = panel.locator(".nbscale-Job-training .nbscale-Bar-label")
        expect(training).to_contain_text("epoch", timeout=120_000)
        expect(training).to_contain_text("left")
        buttons = panel.locator(".nbscale-Job-actions button")
        expect(buttons).to_have_text(["Log", "Cancel", "Copy"])
        expect(panel.locator(".nbscale-pools .nbscale-Worker")).to_have_count(2)
        expect(panel.locator(".nbscale-Pool-title").first).to_contain_text("this notebook")
        docs_picture(panel, "screenshot-panel.png", down_to=panel.locator(".nbscale-jobs"))  # a pool and a job
        for shown in [training, *buttons.all()]:  # in the sidebar as it opens, not off its right edge
            assert _inside(shown, panel), f"{shown.inner_text()!r} is cut off by the panel's edge"

        monitor = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea")
        expect(monitor).to_contain_text("Job 1 'demo', training 1 of 1: following live", timeout=60_000)
        expect(monitor.locator("table")).to_contain_text("Epoch", timeout=60_000)
        # its figure: a PNG until the Stop button's view is heard, then drawn in the browser
        expect(monitor.locator("img, canvas.nbscale-live-figure").first).to_be_visible(timeout=60_000)
        expect(monitor.locator("button", has_text="Stop")).to_be_enabled()
        expect(monitor.locator("table")).to_contain_text(re.compile(r"Epoch\s*([4-9]|[1-5]\d) of 60"), timeout=180_000)
        monitor.scroll_into_view_if_needed()
        docs_picture(monitor, "screenshot-job-monitor.png")

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


def test_the_panel_says_so_when_the_server_cannot_be_reached(lab: Server):
    from playwright.sync_api import expect

    with notebook_page(lab, "pool.ipynb", "server-gone") as page:
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


def test_the_options_form_shows_every_group_an_error_beside_its_field_and_train_uses_it(lab: Server):
    from playwright.sync_api import expect

    with notebook_page(lab, "form.ipynb", "options-form") as page:
        run_cell(page, 0, FORM_CELLS)
        form = run_cell(page, 1, FORM_CELLS).locator(".jp-OutputArea-output")
        tabs = form.get_by_role("tab")
        expect(tabs).to_have_text(
            ["Solver", "Learning rate", "Data & batches", "Validation", "Loss & metrics", "Hardware", "Output"]
        )
        expect(form).to_contain_text("Valid training options")
        tabs.filter(has_text="Learning rate").click()
        preview = form.locator("img")  # the schedule, drawn from the fields
        expect(preview).to_be_visible()
        assert preview.evaluate("img => img.naturalWidth") > 200
        docs_picture(form, "screenshot-options-form.png")
        tabs.filter(has_text="Solver").click()  # gradient_threshold's tab

        threshold = form.locator(".widget-text", has_text="gradient_threshold").first
        threshold.locator("input").fill("abc")
        message = form.get_by_text("TrainingOptions.gradient_threshold: write a number or inf")
        expect(message).to_be_visible()
        field, said = threshold.locator("input").bounding_box(), message.bounding_box()
        assert said["x"] >= field["x"] + field["width"] and abs(said["y"] - field["y"]) < field["height"], (
            f"the message is not beside its field: field {field}, message {said}"
        )
        expect(form).to_contain_text("1 wrong value(s)")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "options-form-error.png"))

        train = run_cell(page, 2, FORM_CELLS)
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


def test_the_gpu_table_names_who_holds_each_gpu(tmp_path: Path):
    """%gpu on two stand-in GPUs (tests/fake_nvml on the kernels' path), GPU 0 reserved by another notebook's
    pool: the table says who holds it, and the panel's GPU section says the same."""
    from playwright.sync_api import expect

    kernel_path = os.pathsep.join(filter(None, [str(FAKE_NVML_DIR), os.environ.get("PYTHONPATH")]))
    registry = tmp_path / "gpu-registry"  # no other test's or notebook's reservations
    registry.mkdir()
    env = {"PYTHONPATH": kernel_path, "NBSCALE_GPU_REGISTRY": str(registry)}
    other = KernelSession(env={**env, "JPY_SESSION_NAME": "analysis.ipynb"})  # named as Jupyter's server names it
    try:
        assert other.run(RESERVE_A_GPU).ok
        with (
            jupyter_server(tmp_path, {"gpu.ipynb": GPU_CELLS}, env=env) as server,
            notebook_page(server, "gpu.ipynb", "gpu-table") as page,
        ):
            run_cell(page, 0, GPU_CELLS)
            table = run_cell(page, 1, GPU_CELLS).locator(".jp-OutputArea-output table")
            rows = table.locator("tr")
            expect(rows).to_have_count(3)
            expect(rows.nth(1)).to_contain_text("NVIDIA H100 80GB HBM3")
            expect(rows.nth(1)).to_contain_text(f"'s pool (notebook analysis.ipynb, pid {other.pid})")
            expect(rows.nth(2)).to_contain_text("NVIDIA A100-SXM4-40GB")
            expect(rows.nth(2)).to_contain_text("free")
            docs_picture(table, "screenshot-gpu.png")

            page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
            gpus = page.locator(".nbscale-Panel .nbscale-gpus")
            expect(gpus).to_contain_text("NVIDIA H100 80GB HBM3", timeout=15_000)
            expect(gpus).to_contain_text(f"pool · analysis.ipynb · pid {other.pid}")
    finally:
        other.shutdown()


def test_in_notebook_7_a_jobs_log_opens_in_a_dialog(tmp_path: Path):
    """Notebook 7's main area holds its one notebook, so the panel's Log button opens the log in a dialog."""
    from playwright.sync_api import expect

    cells = ["%load_ext nbscale", "%%batch --name hello\nprint('hello from the job')\nprint('| row ' * 80)"]
    with (
        jupyter_server(tmp_path, {"job.ipynb": cells}, app="notebook") as server,
        notebook_page(server, "job.ipynb", "notebook7-log") as page,
    ):
        run_cell(page, 0, cells)
        run_cell(page, 1, cells)
        page.evaluate("window.jupyterapp.commands.execute('nbscale:open-panel')")
        job = page.locator(".nbscale-Panel .nbscale-Job").first
        expect(job.locator(".nbscale-State")).to_have_text("finished", timeout=60_000)
        page.locator(".nbscale-Panel .nbscale-Job-actions button", has_text="Log").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Job 1 log")
        expect(dialog.locator(".nbscale-JobLog pre")).to_contain_text("hello from the job", timeout=15_000)
        # a verbose-table row longer than the dialog stays one line, and the log scrolls sideways to it
        log = dialog.locator(".nbscale-JobLog pre")
        expect(log).to_contain_text("| row | row", timeout=15_000)
        shown = log.evaluate("e => [getComputedStyle(e).whiteSpace, e.scrollWidth > e.clientWidth]")
        assert shown == ["pre", True], f"the long row wraps, or cannot be scrolled to: {shown}"
        page.screenshot(path=str(ARTIFACTS / "notebook7-log-dialog.png"))
        dialog.get_by_role("button", name="Close").click()
        expect(dialog).to_have_count(0)
