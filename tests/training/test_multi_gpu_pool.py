"""execution_environment="multi-gpu" starts its pool on the free GPUs, as `%pool start` does: a GPU another notebook
holds is left alone, not an error. Planned against the two-GPU NVML stand-in (tests/fake_nvml) with a real holder
process; trained on real GPUs where there are some."""

from __future__ import annotations

import os
import pwd
import sys

import pytest
import torch

import nbscale
from nbscale.errors import PoolError
from nbscale.gpu_reservations import gpu_key
from nbscale.pool.backends.local import LocalBackend
from nbscale.training.distributed import multi_gpu_pool_settings
from tests.gpu_holder import gpu_holder
from tests.nvml_probe import fake_pynvml
from tests.training.digits import digits, tiny_net

ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def two_stand_in_gpus(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))


def planned_gpus() -> list[str]:
    backend = LocalBackend()
    try:
        return [spec.env["CUDA_VISIBLE_DEVICES"] for spec in backend.plan(multi_gpu_pool_settings())]
    finally:
        backend.stop()  # gives the planned GPUs back


def test_the_multi_gpu_pool_takes_the_free_gpus_and_leaves_a_held_one_alone(two_stand_in_gpus) -> None:
    assert planned_gpus() == ["GPU-aaaa0-1111", "GPU-aaaa1-1111"]  # one worker per GPU
    with gpu_holder(["GPU-aaaa0-1111"], notebook="a.ipynb"):
        assert planned_gpus() == ["GPU-aaaa1-1111"]  # GPU 0 is another notebook's


def test_with_every_gpu_held_the_multi_gpu_pool_names_the_holders(two_stand_in_gpus) -> None:
    with gpu_holder(["GPU-aaaa0-1111", "GPU-aaaa1-1111"], notebook="a.ipynb") as holder:
        with pytest.raises(
            PoolError,
            match=rf"Every GPU of this machine is held by another process: GPU 0 is held by "
            rf"{ME}'s pool \(notebook a.ipynb, pid {holder.pid}\)",
        ):
            planned_gpus()


@pytest.mark.gpu
@pytest.mark.slow
def test_multi_gpu_trains_on_the_gpus_another_notebook_leaves_free(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))
    train, validation = digits()
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=1,
        mini_batch_size=64,
        verbose=False,
        validation_data=validation,
        execution_environment="multi-gpu",
    )
    gpus = nbscale.gpus()
    with gpu_holder([gpu_key(gpus[0].device_id)], notebook="a.ipynb"):
        if len(gpus) == 1:
            with pytest.raises(PoolError, match=r"Every GPU of this machine is held by another process: GPU 0"):
                nbscale.train(tiny_net(), train, options)
            return
        try:
            _, info = nbscale.train(tiny_net(), train, options)
        finally:
            pool = nbscale.current_pool(start=False)
            if pool is not None:
                pool.close()
    assert info.hardware.startswith(f"{len(gpus) - 1} worker") and "NCCL" in info.hardware
    assert torch.cuda.device_count() == len(gpus)
