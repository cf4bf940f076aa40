"""A TrainingMonitor pickles (a %%batch job saves the variables its cell assigned, with cloudpickle, as
nbscale.jobs.runner does): it comes back with what it recorded, its info and status, closed."""

from __future__ import annotations

import cloudpickle

import nbscale
from nbscale.monitor.saved import SavedMonitor


def test_a_monitor_pickles_with_its_history_info_and_status_and_comes_back_closed() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss"], info=["epoch"], min_interval=3600)
    for step in range(1, 21):
        monitor.record(step, loss=1.0 / step)
        if step % 10 == 0:
            monitor.record(step, val_loss=2.0 / step)
    monitor.update_info(epoch=2)
    monitor.status = "fine-tuning"
    monitor.request_stop("Stopped by request")

    back = cloudpickle.loads(cloudpickle.dumps(monitor))

    assert isinstance(back, SavedMonitor) and isinstance(back, nbscale.TrainingMonitor)
    assert back.history == monitor.history
    assert back.history["val_loss"][9] == 0.2 and back.history["val_loss"][0] is None
    assert back.info == {"epoch": 2} and back.status == "fine-tuning"
    assert back.stop and back.stop_reason == "Stopped by request"
    assert back.to_dataframe()["loss"].tolist() == monitor.to_dataframe()["loss"].tolist()
    back.close()  # closed already: nothing to draw or log
