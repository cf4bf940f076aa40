"""`%jobs show ID` / `job.show()` in real kernels: a %%batch job's training watched live from another kernel,
caught up, followed to its end while the notebook stays usable, stopped from the monitor's Stop button, and
shown in full by a restarted kernel."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

import nbscale.jobs as jobs
from tests.jobs.test_batch_magic import submitted_id
from tests.jobs.test_training_record import wait_for_iterations
from tests.kernel_session import KernelSession, needs_clicks_mid_cell

pytestmark = pytest.mark.slow

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WAIT_S = 120  # for a job's first iterations, its process started while other kernels run

# the %%batch cell: digits on the CPU, slowed to ~25 ms an iteration so it runs for some seconds
TRAIN_CELL = """%%batch --name digits
import time, nbscale
from tests.training.digits import digits, tiny_net
(x, y), val = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=EPOCHS, mini_batch_size=32, verbose=False, validation_data=val,
                               validation_frequency=40, output_fn=lambda info: time.sleep(0.02))
net, info = nbscale.train(tiny_net(), (x, y), opts)
"""


class Outputs:
    """Every output a cell got, also those sent after the cell ended (by the monitor's thread)."""

    def __init__(self, kernel: KernelSession) -> None:
        self.kernel = kernel
        self.by_cell: dict[str, list[dict[str, Any]]] = {}
        self.idle: set[str] = set()
        self.errors: dict[str, str] = {}
        self.shown_in: dict[str, str] = {}  # display id -> the cell that showed it

    def execute(self, code: str) -> str:
        return self.kernel.client.execute(code)

    def pump(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                message = self.kernel.client.get_iopub_msg(timeout=0.05)
            except Exception:
                continue
            parent, kind, content = message["parent_header"].get("msg_id"), message["msg_type"], message["content"]
            if kind == "status" and content["execution_state"] == "idle":
                self.idle.add(parent)
            elif kind in ("display_data", "update_display_data", "execute_result"):
                # an update belongs to the cell that showed its display (the front end updates it there), whatever
                # parent the kernel gives it: ipykernel 6 gives a thread's output the latest cell's
                display_id = content.get("transient", {}).get("display_id")
                if kind == "display_data" and display_id:
                    self.shown_in.setdefault(display_id, parent)
                owner = self.shown_in.get(display_id, parent) if kind == "update_display_data" else parent
                self.by_cell.setdefault(owner, []).append(content["data"])
            elif kind == "error":
                self.errors[parent] = content["ename"] + ": " + content["evalue"]
            elif kind == "stream":
                self.by_cell.setdefault(parent, []).append({"text/plain": content["text"]})

    def wait_until(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout} s; outputs so far: {self.texts()[-6:]}")
            self.pump()

    def info_panels(self, cell: str) -> list[str]:
        """The text of each info panel the cell showed, in order."""
        return [d["text/plain"] for d in self.by_cell.get(cell, []) if d.get("text/plain", "").startswith("Job:")]

    def images(self, cell: str) -> int:
        return sum("image/png" in d for d in self.by_cell.get(cell, []))

    def texts(self) -> list[str]:
        return [d.get("text/plain", "") for outputs in self.by_cell.values() for d in outputs]


def iteration_shown(panel: str) -> int:
    match = re.search(r"Iteration: (\d+) of (\d+)", panel)
    return int(match.group(1)) if match else 0


def test_jobs_show_in_another_kernel_catches_up_then_follows_while_the_notebook_stays_usable(kernel) -> None:
    watcher = KernelSession()  # started first, so that it shows the job while the job still trains
    try:
        watcher.run("%load_ext nbscale")
        submitted = kernel.run(TRAIN_CELL.replace("EPOCHS", "5"))
        assert submitted.ok, submitted.text
        job_id = submitted_id(submitted.stdout)
        wait_for_iterations(jobs.get(job_id), 20, timeout=WAIT_S)
        recorded_before = len(jobs.get(job_id).training_info().iteration)
        outputs = Outputs(watcher)
        show = outputs.execute(f"%jobs show {job_id}")
        outputs.wait_until(lambda: show in outputs.idle, 60, "%jobs show did not return")
        assert show not in outputs.errors, outputs.errors
        assert jobs.get(job_id).state == "running"  # it returned at once: the job still runs
        first = outputs.info_panels(show)
        assert first and iteration_shown(first[-1]) >= recorded_before  # caught up on what already happened
        assert outputs.images(show) >= 1
        assert any(WIDGET_VIEW in d for d in outputs.by_cell[show])  # the Stop button

        other = outputs.execute("print(6 * 7)")  # the notebook stays usable while the monitor follows
        outputs.wait_until(lambda: other in outputs.idle, 30, "a cell run while following did not return")
        assert any("42" in d.get("text/plain", "") for d in outputs.by_cell[other])

        outputs.wait_until(
            lambda: any("Done:" in p for p in outputs.info_panels(show)),
            180,
            "the monitor did not follow the job to its end",
        )
        panels = outputs.info_panels(show)
        assert "State: Done: Max epochs completed" in panels[-1]
        assert "Iteration: 230 of 230" in panels[-1] and "Epoch: 5 of 5" in panels[-1]
        shown = [iteration_shown(p) for p in panels]
        assert shown == sorted(shown) and len(set(shown)) >= 3  # followed, not only caught up at the end
        # redrawn after the catch-up (a PNG's redraws are spaced by what they cost: on a busy machine, beside the
        # whole suite, the job ran to its end between the catch-up and one later redraw)
        assert outputs.images(show) >= 2
        outputs.wait_until(
            lambda: any(f"Job {job_id} 'digits' finished" in t for t in outputs.texts()),
            30,
            "the header did not say the job finished",
        )
        assert jobs.get(job_id).wait(30)
    finally:
        watcher.shutdown()


@needs_clicks_mid_cell
def test_the_stop_button_of_jobs_show_stops_the_jobs_training_and_the_job_keeps_its_network(kernel) -> None:
    submitted = kernel.run(TRAIN_CELL.replace("EPOCHS", "100"))
    job_id = submitted_id(submitted.stdout)
    wait_for_iterations(jobs.get(job_id), 5, timeout=WAIT_S)
    outputs = Outputs(kernel)  # the kernel that submitted it watches too
    show = outputs.execute(f"import nbscale\nnbscale.jobs.get({job_id}).show()")
    outputs.wait_until(lambda: show in outputs.idle, 60, "job.show() did not return")
    assert show not in outputs.errors, outputs.errors
    [button] = [d[WIDGET_VIEW]["model_id"] for d in outputs.by_cell[show] if WIDGET_VIEW in d]
    client = kernel.client
    click = {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}}
    client.shell_channel.send(client.session.msg("comm_msg", click))

    job = jobs.get(job_id)
    assert job.wait(60), job.log()
    assert job.state == "finished", job.log()
    info = job.result("info")
    assert info.stop_reason == "Stopped from the job monitor"
    assert info.iteration[-1] < 100 * 46
    assert type(job.result("net")).__name__ == "Sequential"
    outputs.wait_until(
        lambda: any("Done: Stopped from the job monitor" in p for p in outputs.info_panels(show)),
        30,
        "the monitor did not show the stop",
    )


def test_a_restarted_kernel_shows_a_finished_jobs_full_history_and_picks_a_training(kernel) -> None:
    two_trainings = TRAIN_CELL.replace("EPOCHS", "1").replace("sleep(0.02)", "sleep(0)") + (
        "net2, info2 = nbscale.train(tiny_net(1), (x, y), opts.replace(max_epochs=2))\n"
    )
    job_id = submitted_id(kernel.run(two_trainings).stdout)
    assert jobs.get(job_id).wait(120), jobs.get(job_id).log()
    kernel.manager.restart_kernel(now=True)
    kernel.client.wait_for_ready(timeout=60)
    assert kernel.run("%load_ext nbscale").ok

    latest = kernel.run(f"%jobs show {job_id}")
    assert latest.ok, latest.text
    panels = [d["text/plain"] for d in latest.displays if d.get("text/plain", "").startswith("Job:")]
    assert f"Job: {job_id} 'digits', training 2" in panels[-1]
    assert "State: Done: Max epochs completed" in panels[-1] and "Iteration: 92 of 92" in panels[-1]
    assert any("image/png" in d for d in latest.displays)
    assert f"Job {job_id} 'digits' finished: training 2 of 2 shown." in latest.text

    first = kernel.run(f"%jobs show {job_id} --training 1")
    panels = [d["text/plain"] for d in first.displays if d.get("text/plain", "").startswith("Job:")]
    assert "training 1" in panels[-1] and "Iteration: 46 of 46" in panels[-1]

    missing = kernel.run(f"%jobs show {job_id} --training 3")
    assert missing.error_name == "JobError" and "It recorded trainings 1, 2." in missing.error_value
    no_id = kernel.run("%jobs show")
    assert no_id.error_name == "JobError" and "%jobs show 3" in no_id.error_value


@needs_clicks_mid_cell
def test_jobs_show_wait_follows_in_the_cell_and_its_stop_button_works_while_the_cell_runs(kernel) -> None:
    from tests.training.widget_click import run_and_click

    job_id = submitted_id(kernel.run(TRAIN_CELL.replace("EPOCHS", "100")).stdout)
    wait_for_iterations(jobs.get(job_id), 5, timeout=WAIT_S)
    shown = run_and_click(kernel, f"%jobs show {job_id} --wait", click_after=1.0, timeout=120)
    assert shown.ok, shown.text
    job = jobs.get(job_id)
    assert job.state == "finished"  # --wait returned when the job ended
    panels = [d["text/plain"] for d in shown.displays if d.get("text/plain", "").startswith("Job:")]
    assert "State: Done: Stopped from the job monitor" in panels[-1]
    assert job.result("info").stop_reason == "Stopped from the job monitor"


def test_a_job_cancelled_mid_training_ends_the_display_with_its_state_and_no_time_left(kernel) -> None:
    job_id = submitted_id(kernel.run(TRAIN_CELL.replace("EPOCHS", "100")).stdout)
    wait_for_iterations(jobs.get(job_id), 5, timeout=WAIT_S)
    outputs = Outputs(kernel)
    show = outputs.execute(f"%jobs show {job_id}")
    outputs.wait_until(lambda: show in outputs.idle, 60, "%jobs show did not return")
    assert jobs.cancel(job_id)
    outputs.wait_until(
        lambda: any("State: Job cancelled" in p for p in outputs.info_panels(show)),
        30,
        "the display did not say the job was cancelled",
    )
    outputs.wait_until(
        lambda: any(f"Job {job_id} 'digits' cancelled" in t for t in outputs.texts()),
        30,
        "the header did not say the job was cancelled",
    )
    final = [p for p in outputs.info_panels(show) if "State: Job cancelled" in p][-1]
    assert "State: Job cancelled\n" in final + "\n", final  # not "Job cancelled: cancelled"
    assert "Time left" not in final, final  # a cancelled training has no time left
    header = next(t for t in outputs.texts() if f"Job {job_id} 'digits' cancelled" in t)
    assert "(cancelled)" not in header, header


def test_showing_a_job_that_ends_without_a_training_says_so(kernel) -> None:
    job_id = submitted_id(kernel.run("%%batch --name plain\nimport time\ntime.sleep(1)\nx = 1").stdout)
    shown = kernel.run(f"%jobs show {job_id} --wait", timeout=WAIT_S)
    assert shown.ok, shown.text
    assert (
        f"Job {job_id} 'plain' finished without starting a training: only nbscale.train runs inside a job are shown."
    ) in shown.text
    assert "training 1 shown" not in shown.text
