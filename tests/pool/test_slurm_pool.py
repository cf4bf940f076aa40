"""Pools on a real SLURM cluster of two 1-CPU nodes (tests/slurm_cluster.py), used from a real kernel as a notebook
user would: `%pool start 2 --cluster hpc` gets an allocation over both nodes that runs Ray (its head on the first,
a Ray node joining it on the second, a worker on each), spmd, futures and "parallel" training run there,
`%pool` shows the job, a TrainingMonitor in an spmd cell shows and stops as on a local pool, the allocation's time
limit stops `nbscale.train` and `train_async` runs like Stop, and every way a pool ends (stop, the idle timeout, the
interrupt of a pending start, a killed kernel) leaves nothing in squeue.

Ray takes 15-60 s to start in the allocation on 2 busy cores, so one pool (`hpc_pool`) serves the first tests."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.kernel_session import KernelSession, needs_clicks_mid_cell
from tests.monitor.test_training_monitor import SPMD_LOOP
from tests.slurm_cluster import NODE, queue, running_cluster
from tests.training.widget_click import WIDGET_VIEW, run_and_click

pytestmark = pytest.mark.slow
pytest.importorskip("ray")

QUEUE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def slurm():
    """The module's SLURM cluster, two nodes of 1 CPU: the environment its clients need."""
    with running_cluster(nodes=2) as env:
        yield env


def _kernel(slurm: dict[str, str], folder, limits: str = 'time = "10"') -> KernelSession:
    """A kernel whose ~/.config/nbscale/profiles.toml has a slurm profile `hpc` and that reaches the test cluster."""
    (folder / "nbscale").mkdir(exist_ok=True)
    (folder / "nbscale" / "profiles.toml").write_text(
        f'[profiles.hpc]\nbackend = "slurm"\n{limits}\nconnect_timeout = 600\njob_folder = "{folder}/shared"\n'
    )
    environment = {key: value for key, value in slurm.items() if key != "NBSCALE_PROFILES"}
    session = KernelSession(env={**environment, "XDG_CONFIG_HOME": str(folder)})
    session.run("%load_ext nbscale\nimport nbscale, torch")
    return session


@pytest.fixture(scope="module")
def hpc_kernel(slurm, tmp_path_factory) -> Iterator[KernelSession]:
    session = _kernel(slurm, tmp_path_factory.mktemp("hpc"))
    yield session
    session.close(timeout=120)


def _pool_jobs(slurm: dict[str, str]) -> list[str]:
    return [line for line in queue(slurm) if line.endswith("nbscale-pool")]


def _until(condition, timeout: float = QUEUE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def hpc_pool(hpc_kernel):
    """`%pool start 2 --cluster hpc` in the module's kernel: what it printed (the module's tests share the pool)."""
    started = hpc_kernel.run("%pool start 2 --cluster hpc", timeout=900)
    assert started.ok and "Started 2 CPU workers" in started.stdout, started.text
    return started


def test_a_pool_of_2_runs_in_a_slurm_allocation_with_spmd_and_parallel_training(slurm, hpc_kernel, hpc_pool):
    job_id = re.search(r"SLURM job (\d+) runs: Ray started in it", hpc_pool.stdout)
    assert job_id is not None, hpc_pool.stdout
    assert _pool_jobs(slurm) == [f"{job_id[1]} RUNNING nbscale-pool"]
    shown = hpc_kernel.run("%pool")
    assert f"slurm job {job_id[1]} RUNNING" in shown.text, shown.text

    # spmd's collectives across the allocation's two workers, one on each node (SLURM's name for the node it runs on)
    summed = hpc_kernel.run(
        "%%spmd\nimport os\ntotal = allreduce(torch.tensor([rank + 1.0]))\n"
        "print(float(total), 'on', os.environ.get('SLURMD_NODENAME'))"
    )
    assert summed.ok and summed.stdout.count("3.0") == 2, summed.text
    nodes = sorted(re.findall(r"3\.0 on (\S+)", summed.stdout))
    assert nodes == [f"{NODE}1", f"{NODE}2"], summed.stdout

    # futures: pool.map and pool.submit run on the allocation's workers (parfor, parfeval)
    futures = hpc_kernel.run(
        "import os\npool = nbscale.current_pool()\n"
        "print(list(pool.map(lambda v: v * v, range(4))), pool.submit(sum, [1, 2]).result(timeout=120), "
        "pool.submit(os.getpid).result(timeout=120) in [w.pid for w in pool.workers])",
        timeout=300,
    )
    assert futures.ok and "[0, 1, 4, 9] 3 True" in futures.stdout, futures.text

    # training with execution_environment="parallel" runs on the pool there
    trained = hpc_kernel.run(
        "from tests.training.digits import digits, tiny_net\n(train_x, train_y), validation = digits()\n"
        "options = nbscale.TrainingOptions('sgdm', initial_learn_rate=0.1, mini_batch_size=64, max_epochs=8, "
        "validation_data=validation, execution_environment='parallel', plots='none', verbose=False)\n"
        "net, info = nbscale.train(tiny_net(), (train_x, train_y), options)\n"
        "print(info.hardware, info.final_validation_accuracy > 0.85)",
        timeout=600,
    )
    assert trained.ok and "2 workers" in trained.stdout and "True" in trained.stdout, trained.text


@needs_clicks_mid_cell
def test_a_training_monitor_in_an_spmd_cell_shows_in_the_notebook_and_stops_as_on_a_local_pool(hpc_kernel, hpc_pool):
    # the same cell as tests/monitor's local pool test: one display for both ranks, its Stop reaching each rank
    assert hpc_kernel.run("REDUCE, STEPS = 'first', 10**9").ok
    result = run_and_click(hpc_kernel, SPMD_LOOP, click_after=3.0, timeout=300)
    assert result.ok, result.text
    assert len([d for d in result.displays if WIDGET_VIEW in d]) == 1
    assert any("image/png" in d for d in result.displays)
    check = hpc_kernel.run("print(list(stopped), min(last) > 10)")
    assert check.ok and check.stdout.split() == ["[True,", "True]", "True"], check.text
    # reduce="mean": the notebook's curve is the mean of the ranks' 1/step and 2/step
    assert hpc_kernel.run("REDUCE, STEPS = 'mean', 20").ok
    assert hpc_kernel.run(SPMD_LOOP, timeout=300).ok
    check = hpc_kernel.run(
        "from nbscale.monitor.spmd import views\nview = views[max(views)]\n"
        "print(view.history['step'] == list(range(1, 21)), "
        "all(abs(v - 1.5 / s) < 1e-6 for s, v in zip(view.history['step'], view.history['loss'])))"
    )
    assert check.ok and check.stdout.split() == ["True", "True"], check.text


def test_pool_stop_releases_the_allocation(slurm, hpc_kernel, hpc_pool):
    stopped = hpc_kernel.run("%pool stop", timeout=120)
    assert stopped.ok, stopped.text
    assert _until(lambda: not _pool_jobs(slurm)), queue(slurm)


@pytest.mark.timeout(900)  # a second allocation starts Ray: 15-60 s on 2 busy cores, longer beside the whole suite
def test_a_kernel_on_a_login_node_reaches_the_allocation_by_ray_client_and_the_idle_timeout_releases_it(
    slurm, hpc_kernel
):
    # the kernel takes the head for another machine's, as on a login node: it connects by Ray Client
    # (ray://HEAD:CLIENT_PORT, the port the allocation's script gave the head), not as a driver on the head's node
    started = hpc_kernel.run(
        "import nbscale.pool.backends.slurm as slurm_backend, os\n"
        "on_this_machine = slurm_backend._is_this_machine\n"
        "slurm_backend._is_this_machine = lambda ip: False\n"
        "try:\n"
        "    %pool start 1 --cluster hpc --idle-timeout 0.05\n"  # 3 s idle
        "    print('node:', *nbscale.current_pool(start=False).run(lambda: os.environ['SLURMD_NODENAME']))\n"
        "finally:\n"
        "    slurm_backend._is_this_machine = on_this_machine",
        timeout=900,
    )
    assert started.ok and "Started 1 CPU worker" in started.stdout, started.text
    by_client = r"this kernel is on another machine and connects by Ray Client to ray://[\d.]+:\d+"
    assert re.search(by_client, started.stdout) and "node: nbscale-node1" in started.stdout, started.text
    assert _until(lambda: not _pool_jobs(slurm), timeout=120), queue(slurm)
    shown = hpc_kernel.run("%pool")
    assert "The pool shut itself down after 0.05 idle minutes (--idle-timeout)." in shown.stdout, shown.text


def _occupy_the_node(slurm: dict[str, str]) -> str:
    """A job holding both CPUs, so that a pool's allocation waits in the queue."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=2", "--job-name=blocker", "--output=/dev/null", "--wrap", "sleep 600"],
        env=slurm,
        check=True,
        capture_output=True,
        text=True,
    )
    job_id = submitted.stdout.strip()
    assert _until(lambda: f"{job_id} RUNNING blocker" in queue(slurm)), queue(slurm)
    return job_id


def test_a_pending_allocation_says_it_waits_and_the_interrupt_cancels_it(slurm, hpc_kernel):
    blocker = _occupy_the_node(slurm)
    try:
        waiting = hpc_kernel.run(
            "%pool start 2 --cluster hpc",
            # the watchdog starts once the job is submitted and its first progress line written
            interrupt_when=lambda: (
                hpc_kernel.child_running("nbscale.pool.backends.slurm_watchdog")
                and any("PENDING" in line for line in _pool_jobs(slurm))
            ),
            timeout=120,
        )
        assert waiting.error_name == "PoolInterrupted", waiting.text
        assert re.search(r"SLURM job \d+ waits in the queue \(PENDING", waiting.stdout), waiting.stdout
        assert re.search(r"SLURM job \d+ was cancelled \(scancel\), and no pool is running", waiting.text)
        assert _until(lambda: not _pool_jobs(slurm)), queue(slurm)
        assert "No pool is running" in hpc_kernel.run("%pool").stdout
    finally:
        subprocess.run(["scancel", blocker], env=slurm, check=True)


def test_a_killed_kernel_leaves_nothing_in_squeue(slurm, tmp_path):
    blocker = _occupy_the_node(slurm)
    kernel = _kernel(slurm, tmp_path)
    try:
        kernel.client.execute("%pool start 2 --cluster hpc")
        assert _until(lambda: bool(_pool_jobs(slurm))), queue(slurm)
        kernel.kill()
        assert _until(lambda: not _pool_jobs(slurm)), queue(slurm)
    finally:
        kernel.shutdown()
        subprocess.run(["scancel", blocker], env=slurm, check=True)


def test_the_time_limit_stops_a_training_and_a_train_async_run_like_stop_and_their_weights_come_back(slurm, tmp_path):
    # a 10-minute allocation (Ray may take minutes to start on a busy node) whose trainings stop 590 s before its
    # end: from its first seconds on
    kernel = _kernel(slurm, tmp_path, 'time = "10"\nstop_margin = 590')
    try:
        started = kernel.run("%pool start 2 --cluster hpc", timeout=900)
        assert started.ok, started.text
        trained = kernel.run(
            "from tests.training.digits import digits, tiny_net\n(train_x, train_y), validation = digits()\n"
            "net0 = tiny_net()\nfirst = [p.detach().clone() for p in net0.parameters()]\n"
            "options = nbscale.TrainingOptions('sgdm', initial_learn_rate=0.1, mini_batch_size=64, max_epochs=100000, "
            "execution_environment='parallel', plots='none', verbose=False)\n"
            "net, info = nbscale.train(net0, (train_x, train_y), options)\n"
            "net2 = tiny_net()\nsecond = [p.detach().clone() for p in net2.parameters()]\n"
            "run = nbscale.train_async(net2, (train_x, train_y), options)\n"
            "net1, info1 = run.result(timeout=120)\n"
            "print('moved', any(not torch.equal(a, b) for a, b in zip(first, net.parameters())), "
            "any(not torch.equal(a, b) for a, b in zip(second, net1.parameters())))\n"
            "print('epochs', info.epoch[-1] < 100000, info1.epoch[-1] < 100000)\n"
            "print('reason', info.stop_reason)\nprint('async', info1.stop_reason)",
            timeout=300,
        )
        assert trained.ok, trained.text
        assert "moved True True" in trained.stdout and "epochs True True" in trained.stdout, trained.stdout
        for line in ("reason", "async"):
            [reason] = [text for text in trained.stdout.splitlines() if text.startswith(line)]
            assert "time limit (field time of profile 'hpc', 10)" in reason, trained.stdout
            assert "stop_margin = 590 s" in reason, trained.stdout
    finally:
        kernel.close(timeout=120)
