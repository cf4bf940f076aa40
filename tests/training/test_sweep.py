"""nbscale.sweep and nbscale.train_async on a real CPU pool of 2: results for every run, failures, cancelling."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import CancelledError, as_completed, wait

import pytest
import torch
from torch import nn

import nbscale
from nbscale.errors import OptionsError
from nbscale.training.sweep import grid_combinations
from nbscale.ui.sweep_display import SweepDisplay
from tests.training.digits import digits, tiny_net


@pytest.fixture(scope="module")
def data() -> tuple:
    return digits()


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_a_2x2_sweep_on_a_pool_of_2_gives_a_net_and_info_for_every_run_best_first(pool, data) -> None:
    (train_x, train_y), val = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=1, verbose=False)
    grid = {"initial_learn_rate": [0.05, 0.2], "mini_batch_size": [64, 128]}
    result = nbscale.sweep(tiny_net, (train_x, train_y), options, grid, pool=pool, val_data=val)
    assert [run.state for run in result.runs] == ["done"] * 4
    assert [run.params for run in result.runs] == grid_combinations(grid)
    assert all(isinstance(net, nn.Module) for net in result.nets)
    assert [info.iteration[-1] for info in result.infos] == [1500 // 64, 1500 // 128] * 2
    accuracies = [run.info.final_validation_accuracy for run in result.ranked()]
    assert accuracies == sorted(accuracies, reverse=True)
    assert result.best is result.ranked()[0]
    assert "Results (best first)" in repr(result) and "mini_batch_size=128" in repr(result)
    assert len({run.info.hardware for run in result.runs}) == 2  # both workers trained


def test_a_failing_run_keeps_its_error_and_the_others_finish(pool, data) -> None:
    (train_x, train_y), _ = data
    built = []

    def make_model() -> nn.Module:
        built.append(1)
        return nn.Linear(63, 10) if len(built) == 2 else tiny_net()  # the second run's input size is wrong

    options = nbscale.TrainingOptions("adam", max_epochs=1, verbose=False)
    result = nbscale.sweep(
        make_model, (train_x, train_y), options, {"initial_learn_rate": [0.01, 0.02, 0.03]}, pool=pool
    )
    assert [run.state for run in result.runs] == ["done", "failed", "done"]
    assert "mat1 and mat2 shapes cannot be multiplied" in result.runs[1].error
    assert result.nets[1] is None and result.ranked()[-1] is result.runs[1]
    assert "#2 failed" in repr(result)
    assert pool.submit(sum, [1, 2]).result(timeout=30) == 3  # the failed run left its worker usable


def test_cancelling_a_running_run_with_its_button_frees_its_worker_for_the_next_one(pool, data) -> None:
    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=100000, mini_batch_size=500, verbose=False)
    result = nbscale.sweep(
        tiny_net, (train_x, train_y), options, {"initial_learn_rate": [0.01, 0.02, 0.03]}, pool=pool, wait=False
    )
    try:
        _wait_for(lambda: result.runs[0].info.iteration and result.runs[1].info.iteration)
        assert result.runs[2].state == "queued"  # two workers, three runs
        view = SweepDisplay(result.runs)
        view._button_box()
        view.buttons["#1"][0].click()  # the run's Cancel button, as a click in the notebook
        _wait_for(lambda: result.runs[2].info.iteration)  # the third run got the freed worker
        assert result.runs[0].state == "cancelled" and result.runs[0].cancelled()
        assert result.runs[1].state == "running"
    finally:
        result.cancel()
        result.wait(timeout=30)
    assert [run.state for run in result.runs] == ["cancelled"] * 3
    with pytest.raises(CancelledError):
        result.runs[1].result()
    assert pool.run(lambda: torch.get_num_threads()) is not None  # every worker is free again


def test_cancelled_runs_count_as_done_for_wait_and_as_completed(pool, data) -> None:
    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=100000, mini_batch_size=500, verbose=False)
    result = nbscale.sweep(
        tiny_net,
        (train_x, train_y),
        options,
        {"initial_learn_rate": [0.01, 0.02, 0.03]},
        pool=pool,
        wait=False,
        show=False,
    )
    try:
        _wait_for(lambda: result.runs[0].info.iteration and result.runs[1].info.iteration)
        result.cancel()  # two running, one queued
        done, not_done = wait(result.runs, timeout=30)  # before the fix, cancelled runs never counted as done
        assert len(done) == 3 and not not_done
        assert [run.state for run in as_completed(result.runs, timeout=1)] == ["cancelled"] * 3
    finally:  # a failure here must not leave the module's pool training for the tests after it
        result.cancel()
        result.wait(timeout=30)


def test_an_interrupt_while_the_runs_are_sent_cancels_those_sent_and_frees_their_workers(
    pool, data, monkeypatch
) -> None:
    import nbscale.training.sweep as sweep_module

    (train_x, train_y), _ = data
    sent: list = []
    submit_run = sweep_module.submit_run

    def send_one_then_interrupt(*args, **kwargs):
        if sent:
            raise KeyboardInterrupt  # the kernel interrupt, landing as the second run is sent
        sent.append(submit_run(*args, **kwargs))
        return sent[-1]

    monkeypatch.setattr(sweep_module, "submit_run", send_one_then_interrupt)
    options = nbscale.TrainingOptions("sgdm", max_epochs=100000, mini_batch_size=500, verbose=False)
    with pytest.raises(KeyboardInterrupt):
        nbscale.sweep(tiny_net, (train_x, train_y), options, {"initial_learn_rate": [0.01, 0.1]}, pool=pool)
    assert [run.state for run in sent] == ["cancelled"]
    assert pool.submit(sum, [1, 2]).result(timeout=60) == 3 and pool.run(len, "ab") == [2, 2]  # nothing trains on


@pytest.mark.slow
def test_a_kernel_interrupt_of_a_sweep_cell_cancels_the_runs_and_ends_the_cell_at_once(kernel) -> None:
    started = kernel.run(
        "import nbscale\nfrom tests.training.digits import digits, tiny_net\n"
        "(train_x, train_y), val = digits()\n%pool start 2 --cpu"
    )
    assert started.ok, started.text
    cell = """%%train --sweep "initial_learn_rate=0.01,0.1" --epochs 100000 --batch-size 500 --quiet --no-plots
model = tiny_net()
train_data = (train_x, train_y)"""
    began = time.monotonic()
    interrupted = kernel.run(cell, interrupt_after=6.0, timeout=90)
    ended = time.monotonic()
    assert interrupted.ok, interrupted.text
    states = kernel.run("print([run.state for run in sweep_result.runs])")
    assert states.stdout.strip() == "['cancelled', 'cancelled']", states.text
    # the cancelled runs end the wait (it once waited 10 s more for nothing), and the pool is free again soon
    assert ended - began < 6.0 + 9.0
    free = kernel.run(
        "import time\ndeadline = time.monotonic() + 30\nwhile True:\n    try:\n"
        "        print(nbscale.current_pool().run(len, 'ab')); break\n    except Exception:\n"
        "        if time.monotonic() > deadline: raise\n        time.sleep(0.2)"
    )
    # (on a busy machine a cancelled run's task may still be ending: the pool says so once, then runs the call)
    assert free.stdout.strip().splitlines()[-1] == "[2, 2]", free.text


def test_stop_ends_a_run_with_the_network_so_far_and_leaves_the_other_run_alone(pool, data) -> None:
    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=100000, mini_batch_size=500, verbose=False)
    first = nbscale.train_async(tiny_net(), (train_x, train_y), options, pool=pool)
    second = nbscale.train_async(tiny_net(), (train_x, train_y), options, pool=pool)
    try:
        _wait_for(lambda: first.info.iteration and second.info.iteration)
        first.stop()
        net, info = first.result(timeout=30)
        assert info.stop_reason == "Stopped on request" and isinstance(net, nn.Module)
        assert second.state == "running"
    finally:
        second.cancel()
    with pytest.raises(CancelledError):
        second.result(timeout=30)


def test_a_stop_for_every_pool_training_ends_a_run_with_its_reason_and_the_network_so_far(pool, data) -> None:
    # what a SLURM allocation's time limit calls (nbscale.pool.backends.slurm_time_limit); its reason is the run's
    from nbscale.pool.active_stops import stop_all

    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=100000, mini_batch_size=500, verbose=False)
    run = nbscale.train_async(tiny_net(), (train_x, train_y), options, pool=pool)
    _wait_for(lambda: run.info.iteration)
    assert stop_all("Stopped: the time limit") == 1
    net, info = run.result(timeout=30)
    assert info.stop_reason == "Stopped: the time limit" and 0 < info.epoch[-1] < 100000
    assert isinstance(net, nn.Module) and run.info.stop_reason == "Stopped: the time limit"
    assert stop_all("Stopped: the time limit") == 0  # an ended run is no longer asked


def test_runs_of_a_sweep_with_a_checkpoint_path_each_write_and_resume_from_their_own_folder(
    pool, data, tmp_path
) -> None:
    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions(
        "sgdm", max_epochs=2, mini_batch_size=100, verbose=False, checkpoint_path=str(tmp_path)
    )
    result = nbscale.sweep(
        tiny_net, (train_x, train_y), options, {"initial_learn_rate": [0.05, 0.3]}, pool=pool, seed=0
    )
    folders = [run.options.checkpoint_path for run in result.runs]
    assert folders == [str(tmp_path / "run-1"), str(tmp_path / "run-2")]
    assert all(
        sorted(os.listdir(folder)) == ["nbscale_checkpoint_epoch0001.pt", "nbscale_checkpoint_epoch0002.pt"]
        for folder in folders
    )
    for run in result.runs:  # each folder holds its own run: resuming it at its end gives that run's network
        net, _ = nbscale.train(tiny_net(), (train_x, train_y), run.options, resume_from=run.options.checkpoint_path)
        assert all(
            torch.equal(a, b) for a, b in zip(net.state_dict().values(), run.net.state_dict().values(), strict=True)
        )


def test_a_warning_of_a_run_on_a_worker_shows_as_nbscales_without_its_source_lines(pool, data, capfd) -> None:
    (train_x, train_y), _ = data
    options = nbscale.TrainingOptions("sgdm", max_epochs=1, mini_batch_size=100, verbose=False, precision="mixed")
    nbscale.sweep(tiny_net, (train_x, train_y), options, {"initial_learn_rate": [0.1]}, pool=pool)
    shown = capfd.readouterr()
    said = shown.out + shown.err
    assert "nbscale:0: RuntimeWarning: precision='mixed' only speeds up GPUs" in said
    assert ".py:" not in said and "<frozen" not in said  # no nbscale file, line or start-up frame


def test_impossible_grid_values_are_rejected_before_any_run_starts(pool, data) -> None:
    (train_x, train_y), _ = data
    with pytest.raises(OptionsError, match="mini_batch_size"):
        nbscale.sweep(tiny_net, (train_x, train_y), None, {"mini_batch_size": [64, 0]}, pool=pool)
    with pytest.raises(OptionsError, match="Did you mean 'initial_learn_rate'"):
        nbscale.sweep(tiny_net, (train_x, train_y), None, {"initial_learning_rate": [0.1]}, pool=pool)
    with pytest.raises(OptionsError, match="non-empty list"):
        nbscale.sweep(tiny_net, (train_x, train_y), None, {"max_epochs": []}, pool=pool)
    for no_grid in (None, {}):  # said as missing, not as a grid of the wrong kind
        with pytest.raises(OptionsError, match=r"nbscale.sweep needs grid=, the options to vary.*use nbscale.train"):
            nbscale.sweep(tiny_net, (train_x, train_y), None, no_grid, pool=pool, seed=1)
    assert all(worker.state == "idle" for worker in pool.workers)


def test_bad_inputs_to_a_run_on_the_pool_fail_in_the_notebook_before_anything_is_sent(data: tuple) -> None:
    train, _ = data
    with pytest.raises(OptionsError, match="model must be a torch nn.Module"):
        nbscale.train_async(tiny_net, train)  # the function, not a network
    with pytest.raises(OptionsError, match="train_data as a tuple must be"):
        nbscale.sweep(tiny_net, (*train, train[1]), grid={"max_epochs": [1, 2]})


def dropout_net() -> nn.Module:
    """A network whose training draws random numbers (dropout) besides its initial weights."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))


def train_seeded(seed: int, options: nbscale.TrainingOptions, data: tuple) -> tuple[dict, list[float]]:
    """MATLAB's `rng(seed); trainNetwork(...)` in one process: what a seeded parfor iteration runs."""
    torch.manual_seed(seed)
    net, info = nbscale.train(dropout_net(), data, options)
    return net.state_dict(), info.training_loss


def test_sweeps_with_the_same_seed_give_the_same_runs_and_each_run_is_a_seeded_train(pool, data) -> None:
    (train_x, train_y), val = data
    options = nbscale.TrainingOptions(
        "sgdm", max_epochs=1, mini_batch_size=100, verbose=False, execution_environment="cpu", shuffle="every-epoch"
    )
    grid = {"initial_learn_rate": [0.05, 0.2]}
    first = nbscale.sweep(dropout_net, (train_x, train_y), options, grid, pool=pool, val_data=val, seed=7)
    torch.manual_seed(123)  # the notebook's own random stream does not matter
    again = nbscale.sweep(dropout_net, (train_x, train_y), options, grid, pool=pool, val_data=val, seed=7)
    other = nbscale.sweep(dropout_net, (train_x, train_y), options, grid, pool=pool, val_data=val, seed=8)
    for a, b, c in zip(first.runs, again.runs, other.runs, strict=True):
        assert a.info.training_loss == b.info.training_loss != c.info.training_loss
        assert a.info.final_validation_accuracy == b.info.final_validation_accuracy
        assert all(torch.equal(p, q) for p, q in zip(a.net.parameters(), b.net.parameters(), strict=True))
    assert first.best.params == again.best.params and first.best.seed == 7
    # run k is `torch.manual_seed(seed); nbscale.train(make_model(), data, run.options)`: on a worker (a seeded
    # parfor iteration) and in the notebook
    best = first.best
    on_worker = pool.submit(train_seeded, 7, best.options, (train_x, train_y)).result(timeout=120)
    in_notebook = train_seeded(7, best.options, (train_x, train_y))
    weights, losses = on_worker  # the same process kind, thread count included: the same bits
    assert losses == best.info.training_loss
    assert all(torch.equal(weights[name], value) for name, value in best.net.state_dict().items())
    weights, losses = in_notebook  # another thread count sums in another order: the last bits may differ
    assert losses == pytest.approx(best.info.training_loss, rel=1e-5)
    assert all(torch.allclose(weights[name], value, atol=1e-6) for name, value in best.net.state_dict().items())
    with pytest.raises(OptionsError, match="seed=-1 must be a whole number"):
        nbscale.sweep(dropout_net, (train_x, train_y), options, grid, pool=pool, seed=-1)


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2), nn.Linear(512, 10))


def train_augmented_seeded(seed: int, options: nbscale.TrainingOptions, data: object) -> list[float]:
    torch.manual_seed(seed)
    return nbscale.train(small_cnn(), data, options)[1].training_loss


def test_a_seeded_sweep_on_augmented_png_files_is_a_seeded_train(pool, tmp_path) -> None:
    from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore
    from tests.datasets import write_digits_pngs

    files = ImageDatastore(write_digits_pngs(tmp_path / "digits", limit_per_class=30))
    augmented = AugmentedImageDatastore(
        (8, 8),
        files,
        augmenter=ImageAugmenter(rand_x_translation=(-2, 2), rand_y_translation=(-2, 2), rand_rotation=(-10, 10)),
    )
    options = nbscale.TrainingOptions(
        "adam", max_epochs=2, mini_batch_size=30, verbose=False, execution_environment="cpu", initial_learn_rate=0.01
    )
    result = nbscale.sweep(small_cnn, augmented, options, {"initial_learn_rate": [0.01]}, pool=pool, seed=3)
    run = result.runs[0]
    assert pool.submit(train_augmented_seeded, 3, run.options, augmented).result(timeout=120) == run.info.training_loss


def test_a_live_sweep_of_4_runs_on_2_workers_with_fscore_shows_every_row_20_times(pool, data, monkeypatch) -> None:
    """The live table's first draws come while runs #3 and #4 wait for a worker (rows with no metric cells)
    and #1 already trains (its row has them): every draw, in this thread or the display's, must take them all."""
    (train_x, train_y), _ = data
    thread_errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_errors.append(args.exc_value))
    options = nbscale.TrainingOptions(
        "sgdm", max_epochs=1, mini_batch_size=64, metrics=("accuracy", "fscore"), verbose=False
    )
    grid = {"initial_learn_rate": [0.05, 0.1, 0.2, 0.4]}
    small = (train_x[:128], train_y[:128])
    for _ in range(20):
        result = nbscale.sweep(tiny_net, small, options, grid, pool=pool, show=True)
        assert [run.state for run in result.runs] == ["done"] * 4
        assert "training fscore" in repr(result)
    assert thread_errors == []
