"""nbscale.TrainingMonitor for a user's own loop: history, bunched reads, names checked, and in a real kernel its
figure drawn and its Stop button stopping the loop."""

from __future__ import annotations

import base64
import io
import re
import threading
import time

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError
from nbscale.training.events import StopSignal
from tests.kernel_session import needs_clicks_mid_cell
from tests.training.widget_click import run_and_click


def test_history_has_one_row_per_step_and_a_step_recorded_twice_is_one_row() -> None:
    monitor = nbscale.TrainingMonitor(
        metrics=["loss", "val_loss", "accuracy"], info=["epoch"], groups={"loss": ["loss", "val_loss"]}
    )
    for step in range(1, 11):
        monitor.record(step, loss=torch.tensor(1.0 / step), accuracy=0.1 * step)
        if step % 5 == 0:
            monitor.record(step, val_loss=torch.tensor(2.0 / step))
    frame = monitor.to_dataframe()
    assert list(frame.columns) == ["iteration", "loss", "val_loss", "accuracy"]
    assert list(frame["iteration"]) == list(range(1, 11))
    assert frame["loss"].tolist() == pytest.approx([1.0 / s for s in range(1, 11)])
    assert monitor.history["val_loss"] == [
        None,
        None,
        None,
        None,
        pytest.approx(0.4),
        None,
        None,
        None,
        None,
        pytest.approx(0.2),
    ]


def test_records_are_drawn_and_logged_in_bunches_not_at_each_record() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    monitor.record(1, loss=1.0)  # nothing is read (or drawn) before min_interval: a short loop pays no draw
    losses = [torch.tensor(float(i)) for i in range(2, 200)]
    for step, loss in enumerate(losses, 2):
        monitor.record(step, loss=loss)
    monitor.progress = 100  # the end of the loop draws nothing either: the cell's end (or flush, close) does
    assert len(monitor._history["loss"]) == 0 and monitor._records_kept == 199  # kept, not drawn
    monitor.flush()
    assert monitor.history["loss"] == [1.0, *range(2, 200)]


def test_a_name_the_monitor_was_not_given_is_one_clear_error() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], info=["epoch"])
    with pytest.raises(
        OptionsError,
        match=r"'acc' is not one of the monitor's metrics \['loss'\]; add it to "
        r"TrainingMonitor\(metrics=\[...\]\)",
    ):
        monitor.record(1, acc=0.5)
    with pytest.raises(OptionsError, match="'lr' is not one of the monitor's info fields"):
        monitor.update_info(lr=0.1)
    monitor.update_info(epoch=1)
    with pytest.raises(OptionsError, match=r"update_info\(lr=...\): 'lr' is not one of the monitor's info fields"):
        monitor.update_info(epoch=2, lr=0.1)  # checked whenever a name is new, not only on the first call
    monitor.update_info(epoch=3)
    assert monitor.info == {"epoch": 3}
    with pytest.raises(OptionsError, match="no panel shows 'accuracy'"):
        monitor.y_scale("accuracy", "log")
    with pytest.raises(OptionsError, match="each group lists metrics of"):
        nbscale.TrainingMonitor(metrics=["loss"], groups={"both": ["loss", "val_loss"]})
    with pytest.raises(OptionsError, match="reduce='sum'"):
        nbscale.TrainingMonitor(metrics=["loss"], reduce="sum")
    with pytest.raises(OptionsError, match=r"'step' is a parameter of monitor.record\(step, ...\), so it cannot"):
        nbscale.TrainingMonitor(metrics=["loss", "step"])


def test_a_progress_that_is_not_a_number_is_one_clear_error_when_drawn() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    monitor.progress = torch.tensor(25.0)  # read as a number when drawn, like the records
    assert monitor._percent() == 25.0
    monitor.progress = "half"  # set every iteration: checked when drawn, not at each set
    with pytest.raises(OptionsError, match=r"monitor.progress = 'half': give a number, the percent of the loop"):
        monitor._percent()


def test_the_interrupt_asking_to_stop_while_this_thread_is_inside_a_request_does_not_hang() -> None:
    stop = StopSignal()
    asked = threading.Event()

    def interrupted_inside_a_request() -> None:  # the handler runs between two bytecodes of the thread, possibly
        with stop._lock:  # while `request` holds its lock
            stop.request("Stopped by the kernel interrupt")
        asked.set()

    threading.Thread(target=interrupted_inside_a_request, daemon=True).start()
    assert asked.wait(5) and stop.requested and stop.reason == "Stopped by the kernel interrupt"


def test_the_monitors_loggers_receive_every_step_and_are_closed(tmp_path) -> None:
    from nbscale.loggers import CSVLogger

    path = tmp_path / "loop.csv"
    with nbscale.TrainingMonitor(metrics=["loss", "val_loss"], loggers=[CSVLogger(path)]) as monitor:
        for step in range(1, 6):
            monitor.record(step, loss=torch.tensor(float(step)))
        monitor.record(5, val_loss=0.5)
    lines = path.read_text().splitlines()
    assert lines[0] == "step,loss,val_loss" and lines[1:] == [
        "1,1.0,",
        "2,2.0,",
        "3,3.0,",
        "4,4.0,",
        "5,5.0,0.5",  # recorded in two calls: one step
    ]


LOOP = """
import time, torch, nbscale
monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss", "accuracy"], info=["epoch"],
                                  groups={"loss": ["loss", "val_loss"]}, min_interval=0.05)
monitor.y_scale("loss", "log")
steps = 0
for step in range(1, 100000):
    monitor.record(step, loss=torch.tensor(1.0 / step), accuracy=torch.tensor(1 - 1.0 / step))
    if step % 10 == 0:
        monitor.record(step, val_loss=1.5 / step)
    monitor.update_info(epoch=step // 50 + 1)
    monitor.progress = step / 1000
    steps = step
    if monitor.stop:
        break
    time.sleep(0.002)
print("stopped" if monitor.stop else "ran out", monitor.stop_reason)
"""


@needs_clicks_mid_cell
@pytest.mark.slow
def test_a_custom_loop_in_a_real_kernel_draws_the_figure_and_its_stop_button_ends_the_loop(kernel) -> None:
    from PIL import Image

    result = run_and_click(kernel, LOOP, click_after=2.0, timeout=120)
    assert result.ok, result.text
    assert result.stdout.split()[0] == "stopped" and "Stop button" in result.stdout
    pngs = [d["image/png"] for d in result.displays if "image/png" in d]
    assert len(pngs) >= 2  # the empty figure, then live updates and the last one
    image = Image.open(io.BytesIO(base64.b64decode(pngs[-1])))
    assert image.size[0] > 500
    # the monitor's figure has the loss group (log scale) and the accuracy panel, drawn with its values
    check = kernel.run(
        "print([a.get_ylabel() for a in monitor._listeners.display.figure.figure.axes[:2]], "
        "monitor._listeners.display.figure.figure.axes[0].get_yscale(), len(monitor.history['loss']) == steps)"
    )
    assert check.ok and check.stdout.split() == ["['loss',", "'accuracy']", "log", "True"]
    texts = [d.get("text/plain", "") for d in result.displays]
    assert any("Progress:" in t and "epoch:" in t for t in texts)  # the info panel with the loop's info


INTERRUPTED_LOOP = """
import time, nbscale
monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=0.05)
for step in range(1, 10**6):
    monitor.record(step, loss=1.0 / step)
    if step == 10:
        open(LOOPING_MARK, "w").close()  # the loop runs: the test interrupts now
    if monitor.stop:
        break
    time.sleep(0.002)
print(monitor.stop_reason)
"""


@pytest.mark.slow
def test_the_kernel_interrupt_stops_a_monitored_loop_as_it_stops_training_and_is_the_kernels_after(
    kernel, tmp_path
) -> None:
    looping = tmp_path / "looping"
    code = INTERRUPTED_LOOP.replace("LOOPING_MARK", repr(str(looping)))
    result = kernel.run(code, interrupt_when=looping.exists, timeout=120)
    assert result.ok, result.text  # no KeyboardInterrupt: the loop read monitor.stop and ended itself
    assert result.stdout.strip().splitlines()[-1] == "Stopped by the kernel interrupt"
    assert result.text.count("monitor.stop is now True") == 1, result.text  # said once, as training says it
    after = kernel.run("import time\ntime.sleep(30)", interrupt_after=1.0, timeout=60)
    assert not after.ok and "KeyboardInterrupt" in after.text  # the cell's end gave the interrupt back


SPMD_LOOP = """%%spmd
import time, torch, nbscale
from nbscale.pool.context import worker_context
rank = worker_context().rank
monitor = nbscale.TrainingMonitor(metrics=["loss"], x_label="step", reduce=REDUCE, min_interval=0.05)
last = 0
for step in range(1, 100000):
    monitor.record(step, loss=torch.tensor(float(rank + 1) / step))
    last = step
    if monitor.stop or step == STEPS:
        break
    time.sleep(0.005)
stopped = bool(monitor.stop)
"""


@needs_clicks_mid_cell
@pytest.mark.slow
def test_a_monitor_in_an_spmd_cell_shows_once_in_the_notebook_and_its_stop_reaches_every_rank(kernel) -> None:
    assert kernel.run("%load_ext nbscale\n%pool start 2 --cpu").ok
    try:
        assert kernel.run("REDUCE, STEPS = 'first', 10**9").ok
        result = run_and_click(kernel, SPMD_LOOP, click_after=3.0, timeout=120)
        assert result.ok, result.text
        buttons = [d for d in result.displays if "application/vnd.jupyter.widget-view+json" in d]
        assert len(buttons) == 1  # one monitor for the two ranks
        check = kernel.run("print(list(stopped), min(last) > 10)")
        assert check.ok and check.stdout.split() == ["[True,", "True]", "True"], check.text
        # reduce="mean": the notebook's curve is the mean of the ranks' (1/step and 2/step)
        assert kernel.run("REDUCE, STEPS = 'mean', 20").ok
        result = kernel.run(SPMD_LOOP)
        assert result.ok, result.text
        check = kernel.run(
            "from nbscale.monitor.spmd import views\nview = views[max(views)]\n"
            "print(view.history['step'] == list(range(1, 21)), "
            "all(abs(v - 1.5 / s) < 1e-6 for s, v in zip(view.history['step'], view.history['loss'])))"
        )
        assert check.ok and check.stdout.split() == ["True", "True"], check.text
    finally:
        kernel.run("%pool stop")


BATCH_LOOP = """%%batch --name own-loop
import time, torch, nbscale
monitor = nbscale.TrainingMonitor(metrics=["loss", "fscore"], info=["epoch"])
for step in range(1, 100000):
    monitor.record(step, loss=torch.tensor(1.0 / step), fscore=torch.tensor(1 - 1.0 / step))
    monitor.update_info(epoch=1 + step // 100)
    if monitor.stop:
        break
    time.sleep(0.02)
reason = monitor.stop_reason
"""


@needs_clicks_mid_cell
@pytest.mark.slow
def test_a_monitor_in_a_batch_job_is_followed_by_jobs_show_and_stopped_from_its_button(kernel) -> None:
    import nbscale.jobs as jobs
    from tests.jobs.test_batch_magic import submitted_id
    from tests.jobs.test_job_monitor import WIDGET_VIEW, Outputs

    assert kernel.run("%load_ext nbscale").ok
    job_id = submitted_id(kernel.run(BATCH_LOOP).stdout)
    job = jobs.get(job_id)
    deadline, history = time.monotonic() + 120, None
    while not (isinstance(history, dict) and len(history["iteration"]) >= 5):  # the monitor's own history
        assert time.monotonic() < deadline and job.state in ("queued", "running"), job.log()
        time.sleep(0.1)
        history = job.training_info() if job.trainings else None  # an empty record says nothing yet
    assert history["iteration"][:2] == [1, 2] and history["fscore"][:2] == pytest.approx([0.0, 0.5])
    outputs = Outputs(kernel)
    show = outputs.execute(f"%jobs show {job_id}")
    outputs.wait_until(lambda: show in outputs.idle, 60, "%jobs show did not return")
    assert show not in outputs.errors, outputs.errors
    # the monitor's own display: its info field and x label, none of nbscale.train's fields
    panel = outputs.info_panels(show)[-1]
    assert f"Job: {job_id} 'own-loop', training 1" in panel and "State: Running" in panel, panel
    assert re.search(r"Iteration: \d+", panel) and re.search(r"epoch: \d+", panel), panel
    assert "Mini-batch" not in panel and " of " not in panel, panel
    [button] = [d[WIDGET_VIEW]["model_id"] for d in outputs.by_cell[show] if WIDGET_VIEW in d]
    client = kernel.client
    click = {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}}
    client.shell_channel.send(client.session.msg("comm_msg", click))
    assert job.wait(60), job.log()
    assert job.state == "finished", job.log()
    assert job.result("reason") == "Stopped from the job monitor"
    assert outputs.images(show) >= 1
    outputs.wait_until(
        lambda: "State: Stopped: Stopped from the job monitor" in outputs.info_panels(show)[-1],
        30,
        "the display did not show the stop",
    )
