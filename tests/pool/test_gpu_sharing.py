"""Two notebooks on one two-GPU machine share its GPUs fairly: real kernels (each named like a notebook, as
Jupyter's server does), the pynvml stand-in (tests/fake_nvml) on their path, a registry folder of the test's own.

A GPU pool's workers need CUDA, which this machine may lack, so the kernels plan their pools through the local
backend (what `%pool start` does first: choose and reserve the GPUs) and do not start workers; `%pool start`
itself is run where it fails before any worker starts, on a held GPU. tests/pool/test_gpu_pool.py starts real GPU
pools where a GPU is visible.
"""

from __future__ import annotations

import os
import pwd
import signal
import sys
import time

import pytest

from nbscale.errors import PoolError
from nbscale.pool.devices import plan_devices
from tests.kernel_session import KernelSession
from tests.nvml_probe import FAKE_NVML_DIR, fake_pynvml

pytestmark = pytest.mark.slow
ME = pwd.getpwuid(os.geteuid()).pw_name

PLAN = """
from nbscale.pool.backends.local import LocalBackend
from nbscale.pool.settings import PoolSettings
backend = LocalBackend()
globals().setdefault("backends", []).append(backend)  # each plan's GPUs stay held while its backend lives
print([spec.env["CUDA_VISIBLE_DEVICES"] for spec in backend.plan(PoolSettings({settings}))])
"""


@pytest.fixture
def notebooks(tmp_path, monkeypatch):
    """Start kernels that see two stand-in GPUs: `notebooks("a.ipynb")`; all shut down afterwards."""
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))
    path = os.pathsep.join([str(FAKE_NVML_DIR), os.environ.get("PYTHONPATH", "")])
    started: list[KernelSession] = []

    def start(name: str) -> KernelSession:
        kernel = KernelSession(env={"PYTHONPATH": path, "JPY_SESSION_NAME": name})
        started.append(kernel)
        assert kernel.run("%load_ext nbscale\nimport nbscale").ok
        return kernel

    yield start
    for kernel in started:
        kernel.shutdown()


def test_two_notebooks_take_different_gpus_and_each_sees_who_holds_the_other(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    assert first.run(PLAN.format(settings="1")).stdout.strip() == "['GPU-aaaa0-1111']"
    assert second.run(PLAN.format(settings="")).stdout.strip() == "['GPU-aaaa1-1111']"  # the free one
    note = second.run("from nbscale.ui.gpu_table import pool_gpus_note\nprint(pool_gpus_note(nbscale.gpus()))")
    assert note.stdout.strip() == f"on GPU 1. Held by others: GPU 0 by {ME}'s pool (notebook a.ipynb, pid {first.pid})."

    shown = second.run("%gpu")
    assert shown.ok, shown.text
    rows = shown.text.split("\n")
    gpu0 = next(row for row in rows if row.startswith("0 "))
    gpu1 = next(row for row in rows if row.startswith("1 "))
    assert f"{ME}'s pool (notebook a.ipynb, pid {first.pid})" in gpu0
    assert f"{ME}'s pool (notebook b.ipynb, pid {second.pid})" in gpu1


def test_asking_for_a_held_gpu_names_its_holder_and_force_shares_it(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    first.run(PLAN.format(settings="gpus=[0]"))
    refused = second.run("%pool start --gpus 0")
    assert refused.error_name == "PoolError"
    assert f"GPU 0 is held by {ME}'s pool (notebook a.ipynb, pid {first.pid})" in refused.text
    assert "free now: 1" in refused.text and "--force" in refused.text

    forced = second.run(PLAN.format(settings="gpus=[0], force=True"))
    assert forced.stdout.strip() == "['GPU-aaaa0-1111']", forced.text
    holders = second.run("print([h.pid for h in nbscale.gpus()[0].holders])")
    assert holders.stdout.strip() == str([first.pid, second.pid])


def test_with_every_gpu_held_pool_start_says_by_whom(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    first.run(PLAN.format(settings=""))
    refused = second.run("%pool start")
    assert refused.error_name == "PoolError"
    assert "Every GPU of this machine is held by another process" in refused.text
    assert f"GPU 0 is held by {ME}'s pool (notebook a.ipynb, pid {first.pid}); GPU 1 is held by" in refused.text
    assert "--cpu" in refused.text


def test_a_killed_notebooks_gpus_are_free_at_once(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    first.run(PLAN.format(settings=""))
    assert second.run("print(sum(bool(g.holders) for g in nbscale.gpus()))").stdout.strip() == "2"
    os.kill(first.pid, signal.SIGKILL)
    first.manager.provisioner.process.wait()  # type: ignore[union-attr]
    assert second.run("print(sum(bool(g.holders) for g in nbscale.gpus()))").stdout.strip() == "0"
    assert second.run(PLAN.format(settings="2")).stdout.strip() == "['GPU-aaaa0-1111', 'GPU-aaaa1-1111']"


def test_a_stopped_pool_gives_its_gpus_back(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    first.run(PLAN.format(settings=""))
    first.run("backend.stop()")
    assert second.run(PLAN.format(settings="")).stdout.strip() == "['GPU-aaaa0-1111', 'GPU-aaaa1-1111']"


def test_in_notebook_training_moves_off_a_held_gpu_or_warns_when_it_stays(notebooks):
    first, second = notebooks("a.ipynb"), notebooks("b.ipynb")
    first.run(PLAN.format(settings="1"))  # GPU 0
    moved = second.run("from nbscale.gpu import training_gpu\nprint(training_gpu(0))")
    assert moved.stdout.strip() == "1"
    assert f"GPU 0 is held by {ME}'s pool (notebook a.ipynb, pid {first.pid}): training on GPU 1" in moved.stderr
    held = second.run("print([(h.pid, h.purpose) for h in nbscale.gpus()[1].holders])")
    assert held.stdout.strip() == str([(second.pid, "training")])

    first.run(PLAN.format(settings="gpus=[1], force=True"))  # now every GPU is held by the first notebook
    stays = second.run("import warnings\nwarnings.simplefilter('always')\nprint(training_gpu(0))")
    assert stays.stdout.strip() == "0" and "training shares it (no GPU is free)" in stays.stderr


def test_gpu_workers_that_cannot_use_their_gpu_end_the_start_at_once_with_each_ranks_cause(notebooks):
    """NVML shows GPUs that CUDA cannot use (here the stand-in's GPUs; a CPU build of torch or a broken driver on a
    real machine): the rank that fails first used to leave the others waiting for it in torch's store (minutes)."""
    kernel = notebooks("a.ipynb")
    started = time.monotonic()
    refused = kernel.run("%pool start 2 --gpus 0,1", timeout=90)
    assert refused.error_name == "PoolError", refused.text
    assert "Joining the torch.distributed group (cuda:nccl,cpu:gloo) failed, so no pool started. rank" in refused.text
    assert time.monotonic() - started < 45
    assert kernel.run("print(nbscale.current_pool())").stdout.strip() == "None"


def test_planning_in_this_process_leaves_held_gpus_alone(monkeypatch, tmp_path):
    """The same rule without kernels: plan_devices against the stand-in, with a real holder process."""
    from tests.gpu_holder import gpu_holder

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))
    with gpu_holder(["GPU-aaaa1-1111"], purpose="training", notebook="c.ipynb") as holder:
        assert plan_devices(None, None, cpu=False) == ["GPU-aaaa0-1111"]
        assert plan_devices(None, None, cpu=False, force=True) == ["GPU-aaaa0-1111", "GPU-aaaa1-1111"]
        with pytest.raises(
            PoolError, match=rf"GPU 1 is held by {ME}'s training \(notebook c.ipynb, pid {holder.pid}\)"
        ):
            plan_devices(None, (1,), cpu=False)
        with pytest.raises(
            PoolError, match=r"2 GPU workers asked for but only 1 of the 2 GPUs are free: GPU 1 is held"
        ):
            plan_devices(2, None, cpu=False)


def test_force_where_there_is_nothing_to_share_is_refused():
    import nbscale

    with pytest.raises(PoolError, match="--force shares this machine's GPUs.*--cpu starts no GPU worker"):
        nbscale.Pool(1, cpu=True, force=True)
    with pytest.raises(PoolError, match="--force .*a cluster pool takes the GPUs Ray gives it"):
        nbscale.Pool(1, cluster="ray://head:10001", force=True)
    with pytest.raises(PoolError, match=r"force \(--force\) must be True or False"):
        nbscale.Pool(1, force="yes")  # type: ignore[arg-type]
