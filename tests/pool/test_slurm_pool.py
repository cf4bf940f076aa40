"""Pools on a real one-node SLURM cluster (tests/slurm_cluster.py), used from a real kernel as a notebook user
would: `%pool start 2 --cluster hpc` gets an allocation that runs Ray, spmd and "parallel" training run there,
`%pool` shows the job, and every way a pool ends (stop, the interrupt of a pending start, a killed kernel) leaves
nothing in squeue.

Ray takes 15-60 s to start in the allocation on 2 busy cores, so one pool serves the first tests."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.kernel_session import KernelSession
from tests.slurm_cluster import queue, running_cluster

pytestmark = pytest.mark.slow
pytest.importorskip("ray")

QUEUE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def slurm():
    """The module's SLURM cluster: the environment its clients need."""
    with running_cluster() as env:
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
    session.run("p = nbscale.current_pool(start=False)\nif p is not None: p.close()", timeout=120)
    session.shutdown()


def _pool_jobs(slurm: dict[str, str]) -> list[str]:
    return [line for line in queue(slurm) if line.endswith("nbscale-pool")]


def _until(condition, timeout: float = QUEUE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_pool_of_2_runs_in_a_slurm_allocation_with_spmd_and_parallel_training(slurm, hpc_kernel):
    started = hpc_kernel.run("%pool start 2 --cluster hpc", timeout=900)
    assert started.ok and "Started 2 CPU workers" in started.stdout, started.text
    job_id = re.search(r"SLURM job (\d+) runs: Ray started in it", started.stdout)
    assert job_id is not None, started.stdout
    assert _pool_jobs(slurm) == [f"{job_id[1]} RUNNING nbscale-pool"]
    shown = hpc_kernel.run("%pool")
    assert f"slurm job {job_id[1]} RUNNING" in shown.text, shown.text

    # spmd's collectives across the allocation's two workers
    summed = hpc_kernel.run("%%spmd\ntotal = allreduce(torch.tensor([rank + 1.0]))\nprint(float(total))")
    assert summed.ok and summed.stdout.count("3.0") == 2, summed.text

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

    stopped = hpc_kernel.run("%pool stop", timeout=120)
    assert stopped.ok, stopped.text
    assert _until(lambda: not _pool_jobs(slurm)), queue(slurm)


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


def test_the_time_limit_stops_a_training_like_stop_and_its_weights_come_back(slurm, tmp_path):
    # a 2-minute allocation whose trainings stop 100 s before its end: about 20 s after it starts
    kernel = _kernel(slurm, tmp_path, 'time = "2"\nstop_margin = 100')
    try:
        started = kernel.run("%pool start 2 --cluster hpc", timeout=900)
        assert started.ok, started.text
        trained = kernel.run(
            "from tests.training.digits import digits, tiny_net\n(train_x, train_y), validation = digits()\n"
            "net0 = tiny_net()\nfirst = [p.detach().clone() for p in net0.parameters()]\n"
            "options = nbscale.TrainingOptions('sgdm', initial_learn_rate=0.1, mini_batch_size=64, max_epochs=100000, "
            "execution_environment='parallel', plots='none', verbose=False)\n"
            "net, info = nbscale.train(net0, (train_x, train_y), options)\n"
            "print('moved', any(not torch.equal(a, b) for a, b in zip(first, net.parameters())))\n"
            "print('epochs', info.epoch[-1] < 100000)\nprint('reason', info.stop_reason)",
            timeout=300,
        )
        assert trained.ok, trained.text
        assert "moved True" in trained.stdout and "epochs True" in trained.stdout, trained.stdout
        assert "time limit (field time of profile 'hpc'" in trained.stdout, trained.stdout
        assert "stop_margin = 100 s" in trained.stdout, trained.stdout
    finally:
        kernel.run("p = nbscale.current_pool(start=False)\nif p is not None: p.close()", timeout=120)
        kernel.shutdown()
