"""GPU pools (run where a GPU is visible; skipped elsewhere): one worker per GPU, NCCL, CUDA-safe start."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_gpu_pool_allreduces_on_the_device(kernel):
    import torch

    count = torch.cuda.device_count()
    assert kernel.run("%pool start").stdout.startswith(f"Started {count} GPU worker{'s' * (count != 1)} in")
    cell = kernel.run(
        "%%spmd\nx = torch.ones(4, device=device) * (rank + 1)\ntotal = allreduce(x)\n"
        "print(total.device, total.sum().item())"
    )
    expected = 4 * sum(range(1, count + 1))
    assert cell.ok, cell.text
    assert f"[0] cuda:0 {float(expected)}" in cell.stdout
    # API.md's broadcast of a notebook tensor (sent to the workers on the CPU) and of one on rank 0's GPU
    assert kernel.run("import torch\nweights = torch.arange(3.0)").ok  # the notebook's own torch
    cell = kernel.run(
        "%%spmd\nw = broadcast(weights if rank == 0 else None)\n"
        "g = broadcast(torch.full((2,), 7.0, device=device) if rank == 0 else None)\n"
        "print(w.device, w.tolist(), g.device == device, g.tolist())"
    )
    assert cell.ok, cell.text
    assert f"[{count - 1}] cpu [0.0, 1.0, 2.0] True [7.0, 7.0]" in cell.stdout


def test_pool_starts_and_restarts_after_the_notebook_used_cuda(kernel):
    """accelerate's "Cannot re-initialize CUDA in forked subprocess" must never happen here."""
    kernel.run("import torch\nbefore = torch.ones(3, device='cuda')")
    assert kernel.run("%pool start --gpus 0").ok
    kernel.run("after = torch.ones(3, device='cuda') * 2")
    assert kernel.run("%pool restart").ok
    cell = kernel.run("%%spmd\nprint(torch.cuda.is_available(), torch.ones(1, device=device).item())")
    assert cell.ok and "[0] True 1.0" in cell.stdout
    assert "re-initialize CUDA" not in cell.text


def test_a_gpu_pool_reserves_its_gpus_until_it_stops(kernel):
    started = kernel.run("%pool start 1")
    assert started.ok and started.stdout.startswith("Started 1 GPU worker in") and " on GPU " in started.stdout
    held = kernel.run("import nbscale, os\nprint([h.pid == os.getpid() for g in nbscale.gpus() for h in g.holders])")
    assert "True" in held.stdout, held.text
    kernel.run("%pool stop")
    after = kernel.run("print([h.pid == os.getpid() for g in nbscale.gpus() for h in g.holders])")
    assert "True" not in after.stdout, after.text
