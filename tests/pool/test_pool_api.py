"""The pool's Python API on real worker processes with a real gloo group (no kernel needed)."""

from __future__ import annotations

import concurrent.futures
import os
import re
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
    assert pool.run(lambda: (torch.distributed.get_rank(), torch.distributed.get_world_size())) == [
        (0, 3),
        (1, 3),
        (2, 3),
    ]


def test_current_pool_is_the_running_pool(pool):
    assert nbscale.current_pool() is pool


def test_second_pool_is_refused_with_how_to_stop(pool):
    with pytest.raises(PoolError, match="already running.*%pool stop"):
        nbscale.Pool(2, cpu=True)


def test_env_reaches_workers_but_never_status_or_repr(pool):
    assert pool.run(lambda: os.environ.get("NBSCALE_TEST_SECRET")) == ["hunter2"] * 3
    shown = repr(pool) + repr(pool.status()) + pool.status()._repr_html_() + str(pool._state())
    assert "hunter2" not in shown
    assert "NBSCALE_TEST_SECRET=***" in repr(pool)


def test_a_worker_error_quoting_an_env_value_shows_stars_instead(pool):
    def leak() -> None:
        raise RuntimeError(f"could not log in with {os.environ['NBSCALE_TEST_SECRET']}")

    with pytest.raises(WorkerError) as caught:
        pool.run(leak)
    assert "could not log in with ***" in str(caught.value) and "hunter2" not in str(caught.value)


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


def test_broadcast_keeps_every_tensor_shape_dtype_and_any_object(pool):
    code = (
        "sent = [torch.tensor(3), torch.zeros(0, 2), torch.arange(6).reshape(2, 3).t(), torch.tensor([True, False]),\n"
        "        torch.ones((1,) * 40, dtype=torch.float16), None, 'text', {'nested': torch.ones(2)}]\n"
        "received = [broadcast(value if rank == 2 else None, src=2) for value in sent]\n"
        "same = all(type(a) is type(b) and (torch.equal(a, b) and a.dtype == b.dtype if isinstance(a, torch.Tensor)\n"
        "           else str(a) == str(b)) for a, b in zip(sent, received))\n"
    )
    namespace: dict = {}
    pool.spmd(code, namespace=namespace)
    assert namespace["same"][:] == [True, True, True]
    assert namespace["received"][0][2].tolist() == [[0, 3], [1, 4], [2, 5]]


def test_composite_is_each_workers_own_value_in_a_later_cell(pool):
    namespace: dict = {}
    pool.spmd("value = torch.tensor([rank * 1.0])", namespace=namespace)
    composite = namespace["value"]
    assert isinstance(composite, nbscale.Composite)
    assert len(composite) == 3
    assert [v.item() for v in composite[:]] == [0.0, 1.0, 2.0]
    assert composite[-1].item() == 2.0 and composite[-3].item() == 0.0  # from the end, as in a list
    assert [v.item() for v in composite[::-1]] == [2.0, 1.0, 0.0] and [v.item() for v in composite[1:]] == [1.0, 2.0]
    with pytest.raises(IndexError, match="no value on worker -4"):
        composite[-4]
    pool.spmd("doubled = value * 2", namespace=namespace)
    assert [v.item() for v in namespace["doubled"]] == [0.0, 2.0, 4.0]
    composite[1] = torch.tensor([41.0])
    pool.spmd("plus_one = value + 1", namespace=namespace)
    assert namespace["plus_one"][1].item() == 42.0


def test_a_composite_given_to_run_or_push_is_each_workers_own_value_and_elsewhere_says_how_to_use_it(pool):
    namespace: dict = {}
    pool.spmd("mine = rank * 10", namespace=namespace)
    mine = namespace["mine"]
    assert pool.run(lambda value, plus=0: value + plus, mine, plus=mine) == [0, 20, 40]
    pool.push(copied=mine)
    assert pool.pull("copied") == [0, 10, 20]
    with pytest.raises(
        PoolError,
        match="Argument 1 of <lambda>\\(\\) cannot be sent .*Composite 'mine' holds one "
        "value per worker.*pass mine\\[r\\]",
    ):
        pool.submit(lambda value: value, mine)
    with pytest.raises(PoolError, match="Variable 'mine', which <lambda>\\(\\) uses, cannot be sent"):
        list(pool.map(lambda index: mine, [0]))


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
    assert pool.run(os.getpid, targets=1) == pool.run(os.getpid, targets=[1])  # one rank, or several
    with pytest.raises(
        PoolError, match=r"targets=\[1.5\]: give worker ranks as whole numbers, such as targets=\[0, 2\]"
    ):
        pool.run(os.getpid, targets=[1.5])


def test_a_variable_a_cell_function_assigns_through_global_becomes_a_composite(pool):
    namespace: dict = {"counter": 10}
    pool.spmd("def bump():\n    global counter\n    counter += rank\nbump()\n", namespace=namespace)
    assert namespace["counter"][:] == [10, 11, 12]
    pool.spmd("seen = counter", namespace=namespace)  # each worker's own, not the notebook's 10 sent again
    assert namespace["seen"][:] == [10, 11, 12]
    pool.spmd("def load():\n    global numpy_module\n    import numpy as numpy_module\nload()\n", namespace=namespace)
    assert "numpy_module" not in namespace  # a module a function imports is not a result, as a top-level import is not


def test_a_cell_on_some_targets_keeps_the_other_workers_values_of_a_composite(pool):
    namespace: dict = {}
    pool.spmd("kept = rank", namespace=namespace)
    pool.spmd("kept = kept + 100", targets=[1], namespace=namespace)
    assert namespace["kept"][:] == [0, 101, 2]  # workers 0 and 2 did not run the cell: their values stand
    pool.spmd("del kept", targets=[2], namespace=namespace)
    assert namespace["kept"].ranks == (0, 1) and namespace["kept"][:] == [0, 101]
    pool.spmd("del kept", targets=[0, 1], namespace=namespace)
    assert "kept" not in namespace


def test_failure_shows_each_failing_rank_with_cell_line(pool):
    with pytest.raises(WorkerError) as caught:
        pool.spmd("a = 1\nb = 2\nif rank != 0:\n    raise ValueError(f'bad rank {rank}')\n")
    message = str(caught.value)
    assert "ranks 1, 2 (of 3 workers)" in message
    assert "line 4" in message and "ValueError: bad rank 2" in message
    assert "nbscale/pool/worker.py" not in message
    assert pool.run(lambda: "still usable") == ["still usable"] * 3


def test_a_chained_error_shows_its_cause_with_cell_lines_as_python_does(pool):
    with pytest.raises(WorkerError) as caught:
        pool.spmd(
            "try:\n    {}['key']\nexcept KeyError as error:\n    raise ValueError('no key') from error\n", targets=[0]
        )
    message = str(caught.value)
    assert 'File "<spmd cell' in message and "line 2" in message and "KeyError: 'key'" in message
    assert "The above exception was the direct cause of the following exception" in message
    assert message.index("KeyError") < message.index("ValueError: no key")
    with pytest.raises(WorkerError, match="(?s)ZeroDivisionError.*During handling of the above exception.*NameError"):
        pool.spmd("try:\n    1 / 0\nexcept ZeroDivisionError:\n    undefined_name\n", targets=[0])


def test_a_name_error_for_matlabs_spmd_names_adds_one_line_naming_nbscales(pool):
    with pytest.raises(NameError) as caught:  # a WorkerError, and a NameError as every rank's error is one
        pool.spmd("x = spmdIndex", targets=[0, 1])
    message = str(caught.value)
    assert message.count("In %%spmd, MATLAB's spmdIndex is rank + 1: nbscale's names are rank (counted from 0), ") == 2
    assert "world_size and barrier()" in message
    for name, meant in (("numlabs", "world_size"), ("spmdBarrier", "barrier()")):
        with pytest.raises(WorkerError, match=f"MATLAB's {name} is {re.escape(meant)}:"):
            pool.spmd(f"{name}", targets=[0])
    with pytest.raises(WorkerError) as other:
        pool.spmd("undefined_name", targets=[0])
    assert "MATLAB" not in str(other.value)


def test_a_failing_collective_shows_the_cells_line_not_torch_distributed_frames(pool):
    with pytest.raises(WorkerError) as caught:
        pool.spmd("import threading\nshared = broadcast(threading.Lock(), src=0)\n", targets=[0])
    message = str(caught.value)
    assert "line 2" in message and "TypeError: cannot pickle '_thread.lock' object" in message
    assert "distributed_c10d" not in message and "c10d_logger" not in message


def test_unpicklable_variable_is_named(pool):
    import threading

    with pytest.raises(PoolError, match="Variable 'lock'.*cannot be sent"):
        pool.spmd("print(lock)", namespace={"lock": threading.Lock()})


def test_a_file_opened_in_the_notebook_is_named_instead_of_sent_as_a_copy(pool, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("first line\n")
    with (
        path.open() as handle,
        pytest.raises(
            PoolError,
            match="Variable 'handle' cannot be sent.*notes.txt' is a file "
            "opened here: each process must open the file itself",
        ),
    ):
        pool.spmd("print(handle.readline())", namespace={"handle": handle})


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

    def leftovers():
        return [f for f in os.listdir("/dev/shm") if f.startswith(f"nbscale-{os.getpid()}-")]

    assert len(leftovers()) == 1  # big's own, kept for the next call while big lives (nbscale.pool.resident)
    del big
    assert leftovers() == []


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
    pool.spmd(
        f"import sys\nsys.path.insert(0, {str(worker_dir)!r})\nimport nbscale_only_there\n"
        "thing = nbscale_only_there.Thing()"
    )
    with pytest.raises(WorkerError, match="No module named 'nbscale_only_there'"):
        pool.pull("thing")
    assert pool.run(os.getpid) == [w.pid for w in pool.workers]


def test_allreduce_of_numpy_arrays_and_numbers_works_element_by_element(pool):
    namespace = {"np": __import__("numpy")}
    pool.spmd(
        "biggest = allreduce(np.arange(3) * rank, op='max')\n"
        "smallest = allreduce(np.arange(3) - rank, op='min')\n"
        "average = allreduce(np.full(2, float(rank)), op='mean')\n"
        "top = allreduce(rank + 0.5, op='max')\n"
        "int_mean = allreduce(torch.tensor([rank, 2 * rank]), op='mean')\n",
        namespace=namespace,
    )
    assert namespace["biggest"][1].tolist() == [0, 2, 4]
    assert namespace["smallest"][0].tolist() == [-2, -1, 0]
    assert namespace["average"][2].tolist() == [1.0, 1.0]
    assert namespace["top"][:] == [2.5, 2.5, 2.5] and type(namespace["top"][0]) is float
    assert namespace["int_mean"][0].tolist() == [1.0, 2.0]


def test_allreduce_of_tensors_that_differ_between_ranks_fails_at_once_naming_each_shape(pool):
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:  # not a wrong sum on one rank and a hang on the others
        pool.spmd("total = allreduce(torch.ones(2) if rank == 0 else torch.ones(3))")
    assert time.monotonic() - started < 15
    assert "ranks 0, 1, 2 (of 3 workers)" in str(caught.value)
    assert "rank 0: shape (2,) float32; rank 1: shape (3,) float32" in str(caught.value)
    with pytest.raises(ValueError, match="rank 1: not a tensor"):
        pool.spmd("total = allreduce(torch.ones(2) if rank == 0 else 1.0)")
    with pytest.raises(TypeError, match="allreduce\\(op='sum'\\) cannot combine dict values.*allgather"):
        pool.spmd("total = allreduce({'rank': rank})")
    with pytest.raises(ValueError, match="allreduce op must be one of 'sum', 'mean', 'max', 'min', not 'prod'"):
        pool.spmd("total = allreduce(rank, op='prod')")
    assert pool.run(lambda: "still usable") == ["still usable"] * 3


def test_collectives_with_a_src_or_dst_outside_the_targets_say_which_ranks_run_the_cell(pool):
    message = "broadcast\\(src=0\\): worker 0 does not run this cell, which runs on ranks 1, 2 \\(--targets\\)"
    with pytest.raises(ValueError, match=message) as caught:
        pool.spmd("value = broadcast(5)", targets=[1, 2])
    assert "site-packages" not in str(caught.value)
    with pytest.raises(ValueError, match="gather\\(dst=0\\): worker 0 does not run this cell"):
        pool.spmd("value = gather(rank)", targets=[1, 2])
    namespace: dict = {}
    pool.spmd("got = gather(rank, dst=2)\nfrom_2 = broadcast(rank * 10, src=2)", targets=[1, 2], namespace=namespace)
    assert namespace["got"][2] == [1, 2] and namespace["got"][1] is None
    assert namespace["from_2"][:] == [20, 20]


def test_a_notebook_variable_named_like_a_builtin_is_sent(pool):
    namespace = {"input": torch.full((2,), 7.0), "sum": "mine"}
    pool.spmd("seen = (input.tolist(), sum, __name__)", namespace=namespace)
    assert namespace["seen"][1] == ([7.0, 7.0], "mine", "__spmd__")
    pool.spmd("del input, sum")  # the workers' own builtins again, for the tests that follow


def test_a_composite_indexed_by_something_other_than_a_rank_says_how_to_index_it(pool):
    namespace: dict = {}
    pool.spmd("value = rank", namespace=namespace)
    with pytest.raises(TypeError, match="Composite 'value' is indexed by worker rank \\(value\\[0\\]\\) or a slice"):
        namespace["value"]["a"]
    import numpy

    assert namespace["value"][numpy.int64(2)] == 2
    with pytest.raises(TypeError, match="Composite 'value' is set one worker at a time: value\\[r\\] = value"):
        namespace["value"][:] = [1, 2, 3]


def test_what_cannot_be_sent_is_named_for_push_run_submit_and_map(pool):
    import threading

    lock = threading.Lock()
    with pytest.raises(PoolError, match="Variable 'guard' cannot be sent to the workers \\(lock: cannot pickle"):
        pool.push(fine=1, guard=lock)
    with pytest.raises(PoolError, match="Variable 'lock', which <lambda>\\(\\) uses, cannot be sent"):
        pool.submit(lambda: lock)
    with pytest.raises(PoolError, match="Variable 'lock', which <lambda>\\(\\) uses, cannot be sent"):
        pool.run(lambda: lock)
    with pytest.raises(PoolError, match="Argument 2 of isinstance\\(\\) cannot be sent"):
        pool.submit(isinstance, 1, lock)
    with pytest.raises(PoolError, match="Argument key= of sorted\\(\\) cannot be sent"):
        pool.submit(sorted, [], key=lock)
    with pytest.raises(PoolError, match="Argument 1 of abs\\(\\) cannot be sent"):
        list(pool.map(abs, [1, lock]))


def test_map_names_the_failing_item_and_its_timeout_counts_from_the_call(pool):
    with pytest.raises(ZeroDivisionError, match="divmod\\(\\) of pool.map's item 2 failed on rank"):
        list(pool.map(divmod, [1, 2, 3, 4], [1, 1, 0, 1]))
    assert list(pool.map(divmod, [7] * 5, [1, 2, 3, 4, 5])) == [(7, 0), (3, 1), (2, 1), (1, 3), (1, 2)]
    # six sleeps on three workers: each waits less than 1 s for its result, but the last ones end 1.2 s in
    started = time.monotonic()
    with pytest.raises(concurrent.futures.TimeoutError):
        list(pool.map(time.sleep, [0.6] * 6, timeout=1.0))
    assert time.monotonic() - started < 2  # at 1 s, not after the last sleep's 1.2 s plus the wait
    time.sleep(0.5)  # the cancelled sleeps were interrupted: every worker is free again
    assert pool.run(lambda: "free") == ["free"] * 3


def test_an_error_nbscale_raises_on_a_worker_is_its_message_alone(pool):
    with pytest.raises(WorkerError) as caught:
        pool.pull("nonexistent")
    assert "Traceback" not in str(caught.value)
    assert "--- rank 1 ---\nNameError: no variable named 'nonexistent' on this worker" in str(caught.value)
