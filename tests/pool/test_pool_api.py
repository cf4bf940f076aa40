"""The pool's Python API on real worker processes with a real gloo group (no kernel needed)."""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest
import torch

import nbscale
from nbscale.errors import PoolError, WorkerError
from nbscale.pool.context import worker_context


@pytest.fixture(scope="module")
def pool():
    with nbscale.Pool(3, cpu=True, env={"NBSCALE_TEST_SECRET": "hunter2"}) as running:
        yield running


def test_pool_starts_one_process_per_worker_in_one_group(pool):
    assert pool.size == 3
    assert pool.devices == ["cpu", "cpu", "cpu"]
    pids = pool.run(os.getpid)
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert pool.run(lambda: (torch.distributed.get_rank(), torch.distributed.get_world_size())) == [(0, 3), (1, 3), (2, 3)]


def test_current_pool_is_the_running_pool(pool):
    assert nbscale.current_pool() is pool


def test_second_pool_is_refused_with_how_to_stop(pool):
    with pytest.raises(PoolError, match="already running.*%pool stop"):
        nbscale.Pool(2, cpu=True)


def test_env_reaches_workers_but_never_status_or_repr(pool):
    assert pool.run(lambda: os.environ.get("NBSCALE_TEST_SECRET")) == ["hunter2"] * 3
    shown = repr(pool) + repr(pool.status()) + pool.status()._repr_html_() + str(pool.state())
    assert "hunter2" not in shown
    assert "NBSCALE_TEST_SECRET=***" in repr(pool)


def test_spmd_collectives_on_tensors_and_objects(pool):
    namespace = {"scale": 2.0}
    code = (
        "x = torch.arange(3.0) * (rank + 1) * scale\n"
        "total = allreduce(x)\n"
        "mean = allreduce(torch.tensor(float(rank)), op='mean')\n"
        "biggest = allreduce(rank, op='max')\n"
        "shared = broadcast({'from': rank} if rank == 1 else None, src=1)\n"
        "tensor_from_0 = broadcast(torch.full((2,), 7.0) if rank == 0 else None)\n"
        "gathered = gather(rank * 10)\n"
        "everyone = allgather(torch.tensor([rank]))\n"
        "ragged = allgather(torch.zeros(rank + 1))\n"
        "barrier()\n"
        "names = (rank, world_size, str(device))\n"
    )
    results = pool.spmd(code, namespace=namespace)
    assert set(results) >= {"x", "total", "gathered", "names"}
    assert namespace["total"][2].tolist() == [0.0, 12.0, 24.0]
    assert [m.item() for m in namespace["mean"][:]] == [1.0, 1.0, 1.0]
    assert namespace["biggest"][:] == [2, 2, 2]
    assert namespace["shared"][:] == [{"from": 1}] * 3
    assert namespace["tensor_from_0"][2].tolist() == [7.0, 7.0]
    assert namespace["gathered"][0] == [0, 10, 20] and namespace["gathered"][1] is None
    assert [t.item() for t in namespace["everyone"][1]] == [0, 1, 2]
    assert [t.numel() for t in namespace["ragged"][0]] == [1, 2, 3]
    assert namespace["names"][:] == [(0, 3, "cpu"), (1, 3, "cpu"), (2, 3, "cpu")]


def test_composite_is_each_workers_own_value_in_a_later_cell(pool):
    namespace: dict = {}
    pool.spmd("value = torch.tensor([rank * 1.0])", namespace=namespace)
    composite = namespace["value"]
    assert isinstance(composite, nbscale.Composite)
    assert len(composite) == 3
    assert [v.item() for v in composite[:]] == [0.0, 1.0, 2.0]
    assert composite[-1].item() == 2.0 and composite[-3].item() == 0.0  # from the end, as in a list
    with pytest.raises(IndexError, match="no value on worker -4"):
        composite[-4]
    pool.spmd("doubled = value * 2", namespace=namespace)
    assert [v.item() for v in namespace["doubled"]] == [0.0, 2.0, 4.0]
    composite[1] = torch.tensor([41.0])
    pool.spmd("plus_one = value + 1", namespace=namespace)
    assert namespace["plus_one"][1].item() == 42.0


def test_del_in_a_cell_removes_the_composite_but_not_a_notebook_variable(pool):
    namespace: dict = {"weights": 3}
    pool.spmd("scratch = rank + weights\nkept = rank", namespace=namespace)
    assert namespace["scratch"][:] == [3, 4, 5]
    pool.spmd("del scratch, weights", namespace=namespace)
    assert "scratch" not in namespace
    assert namespace["weights"] == 3  # the notebook's own variable stays; only the workers' copies went
    assert namespace["kept"][:] == [0, 1, 2]


def test_targets_run_on_listed_ranks_with_collectives_among_them(pool):
    namespace: dict = {}
    pool.spmd("who = allgather(rank)", targets=[0, 2], namespace=namespace)
    assert namespace["who"].ranks == (0, 2)
    assert namespace["who"][2] == [0, 2]
    assert namespace["who"][-1] == namespace["who"][:][-1] == [0, 2]  # the last of its ranks: worker 2
    with pytest.raises(IndexError, match="no value on worker 1"):
        namespace["who"][1]
    with pytest.raises(PoolError, match="--targets 5"):
        pool.spmd("pass", targets=[5])


def test_failure_shows_each_failing_rank_with_cell_line(pool):
    with pytest.raises(WorkerError) as caught:
        pool.spmd("a = 1\nb = 2\nif rank != 0:\n    raise ValueError(f'bad rank {rank}')\n")
    message = str(caught.value)
    assert "ranks 1, 2 (of 3 workers)" in message
    assert "line 4" in message and "ValueError: bad rank 2" in message
    assert "nbscale/pool/worker.py" not in message
    assert pool.run(lambda: "still usable") == ["still usable"] * 3


def test_unpicklable_variable_is_named(pool):
    import threading

    with pytest.raises(PoolError, match="Variable 'lock'.*cannot be sent"):
        pool.spmd("print(lock)", namespace={"lock": threading.Lock()})


def test_modules_read_by_a_cell_are_imported_on_workers(pool):
    import json as json_module

    namespace = {"js": json_module}
    pool.spmd("text = js.dumps({'rank': rank})", namespace=namespace)
    assert namespace["text"][1] == '{"rank": 1}'


def test_push_and_pull_large_tensor_through_shared_memory(pool):
    big = torch.randn(4 * 1024 * 1024)
    pool.push(big=big)
    sums = pool.run(lambda: worker_context().rank)
    assert sums == [0, 1, 2]
    pulled = pool.pull("big")
    assert all(torch.equal(t, big) for t in pulled)
    pool.spmd("big.mul_(rank)")  # writes stay private to each worker
    assert torch.equal(pool.pull("big", targets=[1])[0], big)
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith(f"nbscale-{os.getpid()}-")]
    assert leftovers == []


def test_run_streams_events_to_the_notebook(pool):
    seen = []

    def emit_three():
        for step in range(3):
            worker_context().emit({"step": step})
        return "done"

    assert pool.run(emit_three, targets=[0], on_event=lambda rank, event: seen.append((rank, event))) == ["done"]
    assert seen == [(0, {"step": 0}), (0, {"step": 1}), (0, {"step": 2})]


def test_submit_and_map_behave_like_concurrent_futures(pool):
    future = pool.submit(pow, 2, 10)
    assert isinstance(future, concurrent.futures.Future)
    assert future.result(timeout=30) == 1024
    assert list(pool.map(pow, [1, 2, 3, 4, 5], [2] * 5)) == [1, 4, 9, 16, 25]
    failing = pool.submit(int, "not a number")
    with pytest.raises(WorkerError, match="invalid literal"):
        failing.result(timeout=30)
    sleepers = [pool.submit(time.sleep, 0.3) for _ in range(3)]
    queued = pool.submit(time.sleep, 0.3)
    assert queued.cancel()  # every worker is busy, so it had not started
    done = list(concurrent.futures.as_completed(sleepers, timeout=30))
    assert len(done) == 3 and queued.cancelled()


def test_a_tasks_exception_is_caught_by_its_own_class_as_in_concurrent_futures(pool):
    failing = pool.submit(divmod, 1, 0)
    with pytest.raises(ZeroDivisionError, match="failed on rank"):
        failing.result(timeout=30)
    assert isinstance(failing.exception(), ZeroDivisionError) and isinstance(failing.exception(), WorkerError)
    with pytest.raises(KeyError):
        list(pool.map(dict().__getitem__, ["missing"]))
    with pytest.raises(ValueError):  # pool.run too, when every failing rank raised the same class
        pool.run(int, "not a number")


def test_status_lists_every_worker(pool):
    status = pool.status()
    text = repr(status)
    assert "3 CPU workers" in text
    for column in ("rank", "host", "pid", "device", "state", "memory"):
        assert column in text
    assert [line.split()[4] for line in text.splitlines()[2:]] == ["idle"] * 3
    assert "<table>" in status._repr_html_()


def test_a_message_one_side_cannot_unpickle_fails_its_request_and_the_pool_stays_usable(pool, tmp_path, monkeypatch):
    (tmp_path / "nbscale_only_here.py").write_text("class Thing:\n    pass\n\ndef answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import nbscale_only_here  # importable in this process, not on the workers

    with pytest.raises(WorkerError, match="No module named 'nbscale_only_here'"):
        pool.run(nbscale_only_here.answer)
    with pytest.raises(WorkerError, match="No module named 'nbscale_only_here'"):
        pool.submit(nbscale_only_here.answer).result(timeout=60)
    # and the other way: a value whose class only the workers can import
    worker_dir = tmp_path / "workers_only"
    worker_dir.mkdir()
    (worker_dir / "nbscale_only_there.py").write_text("class Thing:\n    pass\n")
    pool.spmd(f"import sys\nsys.path.insert(0, {str(worker_dir)!r})\nimport nbscale_only_there\nthing = nbscale_only_there.Thing()")
    with pytest.raises(WorkerError, match="No module named 'nbscale_only_there'"):
        pool.pull("thing")
    assert pool.run(os.getpid) == [w.pid for w in pool.workers]
