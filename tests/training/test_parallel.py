"""execution_environment="parallel" on a real CPU pool of 2 workers."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import TensorDataset

import nbscale
from nbscale import PoolError, TrainingOptions, WorkerError
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()

pytestmark = pytest.mark.slow


def options(**fields: object) -> TrainingOptions:
    base = {
        "initial_learn_rate": 0.1,
        "max_epochs": 3,
        "mini_batch_size": 64,
        "verbose": False,
        "validation_data": VAL,
        "validation_frequency": 20,
    }
    return TrainingOptions("sgdm", **{**base, **fields})


def trained(**fields: object) -> tuple[torch.nn.Module, nbscale.TrainingInfo]:
    torch.manual_seed(1)
    return nbscale.train(tiny_net(), TRAIN, options(**fields))


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(p, q, atol=1e-5) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_parallel_trains_digits_like_one_process(pool: nbscale.Pool) -> None:
    alone, _ = trained(max_epochs=6)
    net, info = trained(execution_environment="parallel", max_epochs=6)
    assert same(alone, net)  # the global mini-batch is split, the update is the same
    assert info.final_validation_accuracy >= 0.9 and "2 workers" in info.hardware
    assert info.stop_reason == "Max epochs completed" and len(info.iteration) == 6 * (1500 // 64)


def test_a_network_with_lazy_layers_trains_in_the_notebook_and_on_the_pool_alike(pool: nbscale.Pool) -> None:
    def lazy_net() -> torch.nn.Module:  # LazyLinear takes its in_features from the first input
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.LazyLinear(32), torch.nn.ReLU(), torch.nn.LazyLinear(10))

    alone, _ = nbscale.train(lazy_net(), TRAIN, options())
    net, info = nbscale.train(lazy_net(), TRAIN, options(execution_environment="parallel"))
    assert alone[0].in_features == 64 and same(alone, net)
    assert info.final_validation_accuracy >= 0.8


@pytest.mark.parametrize("load", [[3, 1], [1, 0], [0, 1]])
def test_worker_load_weights_the_split_and_zero_sits_out(pool: nbscale.Pool, load: list[int]) -> None:
    alone, _ = trained()
    net, info = trained(execution_environment="parallel", worker_load=load)
    assert same(alone, net)
    assert info.hardware.startswith("1 worker" if 0 in load else "2 workers")
    if 0 in load:  # the info panel says which worker sat out
        assert info.hardware.endswith(f"; worker {load.index(0)} sits out (worker_load 0)")
    else:
        assert "sits out" not in info.hardware


def test_augmented_images_train_on_the_pool_like_one_process(pool: nbscale.Pool) -> None:
    """Each image's random reflection and shift depends on the run's seed, the epoch and the image, not on the
    rank that takes it: the pool's update equals one process's."""
    from nbscale.data import AugmentedImageDatastore, ImageAugmenter

    images = TensorDataset(TRAIN[0].view(-1, 1, 8, 8), TRAIN[1])
    augmented = AugmentedImageDatastore(
        (8, 8), images, ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-1, 1), rand_y_translation=(-1, 1))
    )

    def run(**fields: object) -> tuple[torch.nn.Module, nbscale.TrainingInfo]:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Flatten(), tiny_net())
        return nbscale.train(model, augmented, options(validation_data=None, shuffle="every-epoch", **fields))

    (alone, _), (net, info) = run(), run(execution_environment="parallel")
    assert same(alone, net) and "2 workers" in info.hardware


def test_one_worker_with_all_the_work_trains_and_stops_like_one_process(pool: nbscale.Pool) -> None:
    alone, _ = trained(max_epochs=2)
    net, info = trained(execution_environment="parallel", worker_load=[0, 1], max_epochs=2)
    assert same(alone, net) and info.hardware.startswith("1 worker (cpu")
    _, info = trained(
        execution_environment="parallel",
        worker_load=[1, 0],
        max_epochs=50,
        output_fn=lambda info: info.iteration[-1] >= 5,
    )
    assert info.stop_reason == "Stopped by output_fn" and info.iteration[-1] == 5


def test_compiled_training_on_the_pool_trains_like_eager_and_comes_back_plain(pool: nbscale.Pool) -> None:
    eager, _ = trained(execution_environment="parallel", max_epochs=2)
    net, info = trained(execution_environment="parallel", max_epochs=2, compile=True)
    assert type(net) is torch.nn.Sequential and info.final_validation_accuracy >= 0.85
    assert all(torch.allclose(p, q, atol=1e-4) for p, q in zip(eager.parameters(), net.parameters(), strict=True))


def test_a_compiled_run_failing_on_one_worker_is_reported_not_left_hanging(pool: nbscale.Pool) -> None:
    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from nbscale.pool.context import worker_context

        if worker_context().rank == 1:
            raise ValueError("broken loss on purpose")
        return torch.nn.functional.cross_entropy(outputs, labels)

    for compile_network in (True, False):  # failing while compiled, then eagerly after a compiled run
        with pytest.raises(WorkerError, match="broken loss on purpose"):
            nbscale.train(
                tiny_net(), TRAIN, options(execution_environment="parallel", compile=compile_network), loss_fn=loss_fn
            )
    assert trained(execution_environment="parallel", max_epochs=1)[1].stop_reason  # the pool still works


def test_an_error_on_a_worker_names_the_rank(pool: nbscale.Pool) -> None:
    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from nbscale.pool.context import worker_context

        if worker_context().rank == 1:
            raise ValueError("broken loss on purpose")
        return torch.nn.functional.cross_entropy(outputs, labels)

    with pytest.raises(WorkerError, match="broken loss on purpose") as caught:
        nbscale.train(tiny_net(), TRAIN, options(execution_environment="parallel"), loss_fn=loss_fn)
    # told from the rank where it began; rank 0, woken by the torn-down group, is named without gloo's traceback
    message = str(caught.value)
    assert message.startswith("Training failed on worker 1 (worker 0 stopped with it).\n\n--- rank 1 ---")
    assert "Connection" not in message and "_call_impl" not in message and "train_on_worker" not in message
    assert message.endswith("\n\nTraining stopped.")
    assert trained(execution_environment="parallel", max_epochs=1)[1].stop_reason  # the pool still works


def test_out_of_memory_on_a_worker_names_it_and_suggests_a_smaller_mini_batch(pool: nbscale.Pool) -> None:
    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from nbscale.pool.context import worker_context

        if worker_context().rank == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return torch.nn.functional.cross_entropy(outputs, labels)

    with pytest.raises(WorkerError, match="Out of GPU memory on worker 1") as caught:
        nbscale.train(tiny_net(), TRAIN, options(execution_environment="parallel"), loss_fn=loss_fn)
    assert "lower mini_batch_size (now 64)" in str(caught.value)
    assert trained(execution_environment="parallel", max_epochs=1)[1].stop_reason  # the pool still works


def test_a_model_that_cannot_be_sent_is_named(pool: nbscale.Pool) -> None:
    model = tiny_net()
    model.lock = threading.Lock()
    with pytest.raises(PoolError, match="the model cannot be sent"):
        nbscale.train(model, TRAIN, options(execution_environment="parallel"))


def test_a_pool_runs_warnings_come_once_in_the_notebook_at_the_users_line(pool: nbscale.Pool, capfd) -> None:
    """precision='mixed' on CPU workers and a diverging loss warn as training in the notebook does: one
    RuntimeWarning at the user's call, not a line from every worker naming "<frozen runpy>"."""
    with pytest.warns(RuntimeWarning) as caught:
        trained(execution_environment="parallel", precision="mixed", max_epochs=1)
        trained(execution_environment="parallel", initial_learn_rate=1e6, max_epochs=1)
    assert [(str(w.message)[:27], w.filename) for w in caught] == [
        ("precision='mixed' only spee", __file__),
        ("Training loss is inf at ite", __file__),
    ]
    shown = capfd.readouterr()
    assert "RuntimeWarning" not in shown.out + shown.err


def test_output_fn_stops_the_workers_after_the_iteration_it_saw_as_in_the_notebook(pool: nbscale.Pool) -> None:
    """Every rank waits for the notebook's output_fn at each iteration, so its stop lands where it does in the
    notebook's process: the same iterations trained, the same network, output_fn called once per iteration."""
    seen: list[int] = []

    def stop_at_five(info: nbscale.TrainingInfo) -> bool:
        seen.append(info.iteration[-1])
        return info.iteration[-1] >= 5

    alone, alone_info = trained(max_epochs=50, output_fn=stop_at_five)
    assert seen == [1, 2, 3, 4, 5]
    seen.clear()
    net, info = trained(execution_environment="parallel", max_epochs=50, output_fn=stop_at_five)
    assert seen == [1, 2, 3, 4, 5] and info.iteration == alone_info.iteration == [1, 2, 3, 4, 5]
    assert info.stop_reason == "Stopped by output_fn" and same(alone, net)


def test_an_output_fn_that_fails_on_the_pool_raises_its_error_and_leaves_the_pool_usable(pool: nbscale.Pool) -> None:
    def broken(info: nbscale.TrainingInfo) -> bool:
        if info.iteration[-1] == 3:
            raise KeyError("no such column")
        return False

    with pytest.raises(KeyError, match="no such column"):
        trained(execution_environment="parallel", max_epochs=50, output_fn=broken)
    _, info = trained(execution_environment="parallel", max_epochs=1)
    assert info.stop_reason == "Max epochs completed"


def test_a_dying_worker_leaves_the_checkpoint_to_resume_from(pool: nbscale.Pool, tmp_path) -> None:
    def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        import os

        from nbscale.pool.context import worker_context

        loss_fn.calls = getattr(loss_fn, "calls", 0) + 1
        if worker_context().rank == 1 and loss_fn.calls == 2 * 23 + 5:  # in epoch 3
            os._exit(3)
        return torch.nn.functional.cross_entropy(outputs, labels)

    fields = {
        "execution_environment": "parallel",
        "max_epochs": 4,
        "checkpoint_path": str(tmp_path),
        "validation_data": None,
    }
    with pytest.raises(WorkerError, match="resume_from") as caught:
        nbscale.train(tiny_net(), TRAIN, options(**fields), loss_fn=loss_fn)
    assert "1" in str(caught.value)
    assert sorted(p.name for p in tmp_path.glob("*.pt"))[-1] == "nbscale_checkpoint_epoch0002.pt"
    pool.restart()
    _, info = nbscale.train(tiny_net(), TRAIN, options(**fields), resume_from=tmp_path)
    assert info.epoch[-1] == 4 and info.iteration == list(range(1, 4 * 23 + 1))


def test_a_relative_checkpoint_path_lands_in_the_notebooks_folder_after_it_changed(
    pool: nbscale.Pool, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # as %cd after %pool start: the workers stay in the folder the pool started in
    options = TrainingOptions(
        "sgdm",
        max_epochs=1,
        mini_batch_size=100,
        verbose=False,
        plots="none",
        execution_environment="parallel",
        checkpoint_path="checkpoints",
    )
    nbscale.train(tiny_net(), TRAIN, options)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["nbscale_checkpoint_epoch0001.pt"]
    assert options.checkpoint_path == "checkpoints"  # the user's options are left as given
    _, info = nbscale.train(tiny_net(), TRAIN, options.replace(max_epochs=2), resume_from="checkpoints")
    assert info.epoch[-1] == 2


def test_a_worker_that_stopped_answering_gets_no_out_of_memory_hint() -> None:
    from nbscale.training.distributed import _with_recovery_hint

    heartbeat = "worker 0 (pid 1) stopped answering for 20 s: ... or its machine is down or out of memory."
    assert "lower mini_batch_size" not in _with_recovery_hint(heartbeat, None)
    out_of_memory = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert _with_recovery_hint(out_of_memory, None).endswith("Out of GPU memory: lower mini_batch_size.")
