"""TrainingOptions(on_worker_failure="restart"): pool training that survives a lost worker by itself."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError, WorkerError
from nbscale.training.checkpoint import checkpoint_file
from tests.training.digits import digits, tiny_net

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast

ITERATIONS_PER_EPOCH = 1500 // 64


def _options(folder: Path | None, **changes) -> nbscale.TrainingOptions:
    (_, _), validation = digits()
    settings = dict(
        initial_learn_rate=0.1,
        mini_batch_size=64,
        max_epochs=8,
        validation_data=validation,
        execution_environment="parallel",
        plots="none",
        verbose=False,
        checkpoint_path=str(folder) if folder else None,
        on_worker_failure="restart",
    )
    return nbscale.TrainingOptions("sgdm", **{**settings, **changes})


def test_restart_without_a_checkpoint_path_is_refused_naming_it_before_training():
    (train_x, train_y), _ = digits()
    with pytest.raises(
        OptionsError,
        match=r"on_worker_failure='restart' resumes from the last checkpoint, so it "
        r"needs checkpoint_path",
    ):
        nbscale.train(tiny_net(), (train_x, train_y), _options(None))
    with pytest.raises(OptionsError, match=r"execution_environment is 'cpu': train on the pool"):
        nbscale.train(tiny_net(), (train_x, train_y), _options(Path("unused"), execution_environment="cpu"))
    assert nbscale.current_pool() is None  # refused before any pool started


@pytest.fixture
def pool():
    with nbscale.Pool(2, cpu=True) as running:
        yield running


def _written(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def _loss_losing_worker(rank: int, after: Path, how: int = signal.SIGKILL) -> Callable[..., torch.Tensor]:
    """Cross-entropy, with which worker `rank` sends itself `how` (SIGKILL: it dies; SIGSTOP: it freezes) at its
    first step after checkpoint `after` is written from now on, once in the test: the worker is lost at a known
    point, in the first or second iteration of the next epoch, however busy the machine (a watcher thread in the
    kernel, polling for the file, could be late by epochs under load)."""
    since = time.time()
    signalled = Path(f"{after.parent}.signalled")

    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from nbscale.pool.context import worker_context

        if worker_context().rank == rank and _written(after, since) and not signalled.exists():
            signalled.touch()
            os.kill(os.getpid(), how)
        return torch.nn.functional.cross_entropy(outputs, labels)

    return loss_fn


@pytest.mark.slow
def test_a_worker_killed_mid_training_restarts_the_pool_and_training_resumes_from_its_checkpoint(pool, tmp_path, capfd):
    (train_x, train_y), _ = digits()
    lost_pid = pool.workers[1].pid
    net, info = nbscale.train(
        tiny_net(),
        (train_x, train_y),
        _options(tmp_path, max_epochs=12),
        loss_fn=_loss_losing_worker(1, checkpoint_file(tmp_path, 3)),
    )

    assert info.stop_reason.startswith("Max epochs completed (after 1 restart: restart 1 after iteration ")
    assert f"worker 1 (pid {lost_pid}) died: it was killed by SIGKILL" in info.stop_reason
    assert "resumed from the checkpoint of epoch 3" in info.stop_reason
    # info.restarts: one line per restart, the same that stop_reason ends with
    assert len(info.restarts) == 1 and info.restarts[0] in info.stop_reason
    assert info.restarts[0].startswith("restart 1 after iteration ")
    assert f"worker 1 (pid {lost_pid}) died: it was killed by SIGKILL" in info.restarts[0]
    assert info.restarts[0].endswith("; resumed from the checkpoint of epoch 3")
    # one continuous history: every iteration once, in order, to the last one
    assert info.iteration == list(range(1, 12 * ITERATIONS_PER_EPOCH + 1))
    assert info.final_validation_accuracy > 0.85
    assert lost_pid not in [w.pid for w in pool.workers] and all(w.state == "idle" for w in pool.workers)
    said = capfd.readouterr().err
    assert (
        "Training lost a worker (worker 1 (pid" in said
        and "Restarting the pool and resuming from the checkpoint "
        "of epoch 3 (on_worker_failure='restart', restart 1 of at most 3)"
        in said
    )


@pytest.mark.slow
def test_a_checkpoint_of_an_earlier_run_in_the_folder_is_never_resumed_from(pool, tmp_path):
    (train_x, train_y), _ = digits()
    earlier = _options(tmp_path, max_epochs=5, on_worker_failure="error")
    _, quiet = nbscale.train(tiny_net(seed=1), (train_x, train_y), earlier)  # leaves epochs 1..5 of another run
    assert quiet.restarts == []
    net, info = nbscale.train(
        tiny_net(),
        (train_x, train_y),
        _options(tmp_path, max_epochs=3),
        loss_fn=_loss_losing_worker(0, checkpoint_file(tmp_path, 1)),
    )
    assert "resumed from the checkpoint of epoch 1" in info.stop_reason  # this run's own, not the earlier epoch 5
    assert info.iteration == list(range(1, 3 * ITERATIONS_PER_EPOCH + 1))


def test_a_failure_of_the_code_itself_is_raised_not_restarted(pool, tmp_path):
    (train_x, train_y), _ = digits()

    def loss_fn(outputs, labels):
        raise ValueError("a bug in the loss")

    pids = [w.pid for w in pool.workers]
    with pytest.raises(WorkerError, match="a bug in the loss"):
        nbscale.train(tiny_net(), (train_x, train_y), _options(tmp_path), loss_fn=loss_fn)
    assert [w.pid for w in pool.workers] == pids  # no restart: it would only fail again


@pytest.mark.slow
def test_a_frozen_worker_is_given_up_by_the_heartbeat_and_training_resumes_without_it(pool, tmp_path):
    (train_x, train_y), _ = digits()
    frozen_pid = pool.workers[1].pid
    started = time.monotonic()
    net, info = nbscale.train(
        tiny_net(),
        (train_x, train_y),
        _options(tmp_path, max_epochs=12),
        loss_fn=_loss_losing_worker(1, checkpoint_file(tmp_path, 2), how=signal.SIGSTOP),
    )
    print(f"trained, with the frozen worker replaced, in {time.monotonic() - started:.1f} s")
    assert re.search(
        rf"worker 1 \(pid {frozen_pid}\) stopped answering for \d+ s: its process is stopped", info.stop_reason
    )
    assert "resumed from the checkpoint of epoch 2" in info.stop_reason
    assert info.iteration == list(range(1, 12 * ITERATIONS_PER_EPOCH + 1))
    assert frozen_pid not in [w.pid for w in pool.workers]


@pytest.mark.slow
def test_a_restart_is_marked_in_the_progress_figure_and_named_in_the_info_panel(kernel, tmp_path):
    import base64

    from nbscale.ui.progress_figure import _LEGEND_ROOM, _RESTART, _WIDTH
    from tests.ui.test_progress_figure import _pixels_near

    assert kernel.run(f"""
import nbscale
from pathlib import Path
from nbscale.training.checkpoint import checkpoint_file
from tests.training.digits import digits
from tests.training.test_worker_failure_restart import _loss_losing_worker, _options, tiny_net
(train_x, train_y), _ = digits()
pool = nbscale.Pool(2, cpu=True)
folder = Path({str(tmp_path)!r})
opts = _options(folder, max_epochs=8, plots="training-progress")
loss_fn = _loss_losing_worker(1, checkpoint_file(folder, 3))
""").ok
    result = kernel.run("net, info = nbscale.train(tiny_net(), (train_x, train_y), opts, loss_fn=loss_fn)", timeout=240)
    assert result.ok, result.text
    restarts = kernel.run("print(info.restarts)").stdout
    assert "restart 1 after iteration" in restarts and "resumed from the checkpoint of epoch 3" in restarts
    panel = [d["text/plain"] for d in result.displays if d.get("text/plain", "").startswith("State:")][-1]
    assert "\nRestarts: restart 1 after iteration " in panel and "resumed from the checkpoint of epoch 3" in panel
    figure = base64.b64decode([d["image/png"] for d in result.displays if "image/png" in d][-1])
    # a line across both panels where training resumed (the end of epoch 3 of 8), labelled "restart 1"
    left, right = 0.72 / _WIDTH, 1 - _LEGEND_ROOM / _WIDTH  # the axes' span, as a share of the figure's width
    at = left + (right - left) * 3 / 8
    assert _pixels_near(figure, _RESTART, (at - 0.03, 0.05, at + 0.03, 0.95)) > 100
    assert _pixels_near(figure, _RESTART, (left, 0.05, at - 0.05, 0.95)) == 0
