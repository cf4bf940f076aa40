"""What nbscale.train launches per step beyond the hand-written loop, by torch.profiler (issue 46.2).

Runs one of bench/bench_gpu.py's rows (`resnet`, `airbench` or `plain`) both ways under torch.profiler for 1 and
for 3 epochs; the difference of the two counts over the steps of 2 epochs is what one step launches, start-up
cancelled out. On a GPU it counts CUDA kernels by name (device events) and host-device synchronisations; on the
CPU (BENCH_GPU_ON_CPU=1, tiny sizes: a check of the script) it counts aten operators that do work (views and
allocations left out). Prints a table of the per-step counts and every name whose count differs, and with
PROFILE_TRACE_DIR=FOLDER writes each side's 3-epoch trace there, gzipped (chrome://tracing, Perfetto).

    python bench/profile_steps.py resnet           # on a lent GPU machine, after bench/gpu_session.sh
    BENCH_GPU_ON_CPU=1 python bench/profile_steps.py plain
"""

from __future__ import annotations

import collections
import gzip
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_gpu as rows

# operators that launch no work of their own (views, allocation, metadata)
NO_WORK = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::as_strided", "aten::view", "aten::reshape",
    "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice", "aten::narrow", "aten::permute",
    "aten::t", "aten::transpose", "aten::expand", "aten::detach", "aten::alias", "aten::resize_", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::is_nonzero",
    "aten::contiguous", "aten::to", "aten::_to_copy", "aten::new_empty_strided", "aten::set_",
}  # fmt: skip
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def launches(run: Callable[[int], int], epochs: int, trace: Path | None) -> collections.Counter[str]:
    """What `run(epochs)` launched, by name."""
    on_gpu = rows.DEVICE.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as profiler:
        run(epochs)
        if on_gpu:
            torch.cuda.synchronize()
    if trace is not None:  # gzipped: Perfetto and chrome://tracing open it so
        profiler.export_chrome_trace(str(trace))
        with open(trace, "rb") as plain, gzip.open(f"{trace}.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
        trace.unlink()
    counted: collections.Counter[str] = collections.Counter()
    for event in profiler.events():
        if on_gpu and event.device_type == torch.autograd.DeviceType.CUDA:
            counted[f"kernel {event.name[:80]}"] += 1
        elif on_gpu and event.name in SYNCS:
            counted[event.name] += 1
        elif not on_gpu and event.name.startswith("aten::") and event.name not in NO_WORK:
            counted[event.name] += 1
    return counted


def sides(row: str) -> tuple[Callable[[int], int], Callable[[int], int], int]:
    """(nbscale, hand loop) as functions of the epochs, and the steps of an epoch, for bench_gpu's `row`."""
    size = rows.SIZES
    generator = torch.Generator().manual_seed(0)
    if row == "resnet":
        n, side, batch = size.resnet_images, size.resnet_side, size.resnet_batch
        images = torch.randn(n, 3, side, side, generator=generator)
        labels = torch.randint(0, 1000, (n,), generator=generator)
        data = TensorDataset(images, labels)
        return (
            lambda epochs: rows.nbscale_train(rows.resnet50, data, batch, epochs),
            lambda epochs: rows.hand_loop(rows.resnet50, images, labels, batch, epochs, augment=False),
            n // batch,
        )
    n, batch = size.images, size.batch
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    augment = row == "airbench"
    hand_images = images if augment else images.float() / 255
    data = rows.augmented_store(images, labels) if augment else TensorDataset(hand_images, labels)
    return (
        lambda epochs: rows.nbscale_train(rows.airbench_class_net, data, batch, epochs, data_placement="device"),
        lambda epochs: rows.hand_loop(rows.airbench_class_net, hand_images, labels, batch, epochs, augment=augment),
        n // batch,
    )


def main(row: str) -> str:
    ours, hand, steps = sides(row)
    folder = os.environ.get("PROFILE_TRACE_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
    per_step: dict[str, dict[str, float]] = {}
    for name, run in (("nbscale", ours), ("hand", hand)):
        run(1)  # warm-up: cudnn's autotuning, the allocator's pool
        once = launches(run, 1, None)
        thrice = launches(run, 3, Path(folder) / f"{row}_{name}.json" if folder else None)
        per_step[name] = {key: (thrice[key] - once[key]) / (2 * steps) for key in thrice | once}
    names = sorted(set(per_step["nbscale"]) | set(per_step["hand"]))
    differing = [
        (per_step["nbscale"].get(key, 0.0) - per_step["hand"].get(key, 0.0), key)
        for key in names
        if abs(per_step["nbscale"].get(key, 0.0) - per_step["hand"].get(key, 0.0)) >= 0.05
    ]
    what = "CUDA kernels and synchronisations" if rows.DEVICE.type == "cuda" else "aten operators doing work"
    lines = [
        f"## {row}: {what} per step, nbscale.train against the hand loop (bench/profile_steps.py)",
        "",
        f"nbscale {sum(per_step['nbscale'].values()):.1f}, hand loop {sum(per_step['hand'].values()):.1f} a step "
        f"({steps} steps an epoch; the counts of 3 epochs less those of 1, over 2 epochs' steps).",
        "",
        "| name | nbscale | hand | difference |",
        "|---|---:|---:|---:|",
    ]
    for difference, key in sorted(differing, key=lambda item: -abs(item[0])):
        ours_count, hand_count = per_step["nbscale"].get(key, 0.0), per_step["hand"].get(key, 0.0)
        lines.append(f"| {key} | {ours_count:.2f} | {hand_count:.2f} | {difference:+.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "resnet"))
