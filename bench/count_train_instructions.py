"""Instructions per training iteration, nbscale.train against the hand-written loop, counted by valgrind.

Wall-clock ratios on a shared VM move by several percent from run to run (bench_train.py); instruction counts do
not. Each loop runs under `valgrind --tool=callgrind` for 1 and for 3 epochs of the MLP of bench_train.py (one
torch thread, no plots); the difference divided by the iterations of 2 epochs is the cost of one iteration, start-up
and imports cancelled out (start-up varies by tens of millions of instructions between runs, so the estimate is
within about +-3%). Takes ~15 minutes (valgrind runs Python ~50x slower). Run:
`python bench/count_train_instructions.py` (needs valgrind: `apt-get install valgrind`).

`python bench/count_train_instructions.py monitor` counts what a TrainingMonitor adds to the hand-written loop:
instructions and instruction-cache misses (callgrind's cache simulation) per iteration, over the loop alone, with
four calls to a stand-in doing nothing, and with the monitor's four calls (record, update_info, progress, stop;
no display: a script). Only the loop is counted (instrumentation is switched on when it starts), so the counts
need no second run; the same code's runs still differ by up to ~100 misses an iteration (~7 minutes a run, two
at a time). Between a fast loop's kernels a miss, not an instruction, is what Python code costs: torch's code
evicts whatever the loop runs nowhere else (docs/architecture.md, TrainingMonitor).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BATCH, SAMPLES = 64, 7188
ITERATIONS_PER_EPOCH = SAMPLES // BATCH

MODEL = """
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
"""
STEP = """        x, y = X[index], Y[index]
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last_loss = loss.item()
"""  # the hand-written loop's iteration, given `index`

LOOPS = {
    "hand": MODEL
    + """for epoch in range(EPOCHS):
    order = torch.randperm(len(X))
    for i in range(len(X) // BATCH):
        index = order[i * BATCH:(i + 1) * BATCH]
"""
    + STEP,
    "nbscale": """
import nbscale
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, momentum=0.9, l2_regularization=0.0,
    max_epochs=EPOCHS, mini_batch_size=BATCH, shuffle="every-epoch", verbose=False, execution_environment="cpu")
nbscale.train(make_model(), (X, Y), options)
""",
}

SETUP = f"""
import torch
from torch import nn
torch.set_num_threads(1)
X, Y = torch.randn({SAMPLES}, 64), torch.randint(0, 10, ({SAMPLES},))
BATCH = {BATCH}
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
"""


def instructions(loop: str, epochs: int) -> int:
    """Instructions the whole process executed (callgrind's 'Collected')."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "loop.py"
        script.write_text(SETUP + f"EPOCHS = {epochs}\n" + LOOPS[loop])
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/out", sys.executable, str(script)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


MONITOR_ITERATIONS = 300
MONITOR_LOOP = (
    MODEL
    + """def run(iterations):
    for step in range(1, iterations + 1):
        index = torch.randint(0, len(X), (BATCH,))
"""
    + STEP
    + """        if monitor is not None:
            monitor.record(step, loss=loss)
            monitor.update_info(epoch=1)
            monitor.progress = 100 * step / iterations
            if monitor.stop:
                break
run(20)  # warm: the allocator and caches
import os, subprocess
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
eval(compile("run(ITERATIONS)", "loop", "exec"))  # counted: callgrind collects inside builtin eval only
"""
)
MONITORS = {
    "hand-written loop": "monitor = None",
    "+ four calls to a stand-in doing nothing": """
class StandIn:
    stop, progress = False, None
    def record(self, step, **values): pass
    def update_info(self, **values): pass
monitor = StandIn()""",
    "+ nbscale.TrainingMonitor": """
import nbscale
monitor = nbscale.TrainingMonitor(metrics=["loss"], info=["epoch"], min_interval=3600)  # reads: not counted""",
}


def loop_counts(monitor: str) -> tuple[float, float]:
    """(instructions, instruction-cache misses) per iteration of MONITOR_LOOP with `monitor`."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "loop.py"
        script.write_text(SETUP + f"ITERATIONS = {MONITOR_ITERATIONS}\n" + monitor + MONITOR_LOOP)
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--collect-atstart=no",
                "--toggle-collect=builtin_eval",
                "--cache-sim=yes",
                f"--callgrind-out-file={folder}/out",
                sys.executable,
                str(script),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
    instructions, misses = (_summed(done.stderr, name) / MONITOR_ITERATIONS for name in ("I   refs", "I1  misses"))
    return instructions, misses


def _summed(summary: str, name: str) -> int:
    """A count of valgrind's summary ("==pid== I1  misses:   19,615,369")."""
    found = re.search(rf"{name}:\s+([\d,]+)", summary)
    if found is None:
        raise RuntimeError(f"valgrind printed no {name.split()[0]} count:\n{summary[-2000:]}")
    return int(found.group(1).replace(",", ""))


def run_monitor() -> str:
    with ThreadPoolExecutor(2) as runs:
        counts = dict(zip(MONITORS, runs.map(loop_counts, MONITORS.values()), strict=True))
    hand_instructions, hand_misses = counts["hand-written loop"]
    rows = [
        f"| {name} | {instructions:,.0f} | {instructions - hand_instructions:+,.0f} | {misses:,.0f} | "
        f"{misses - hand_misses:+,.0f} |"
        for name, (instructions, misses) in counts.items()
    ]
    return "\n".join(
        [
            "## TrainingMonitor: instructions and instruction-cache misses per iteration "
            "(bench/count_train_instructions.py monitor)",
            "",
            f"The MLP loop of bench_train.py, mini-batch {BATCH}, one torch thread, {MONITOR_ITERATIONS} iterations "
            "counted by callgrind's cache simulation (32 KB L1 instruction cache).",
            "",
            "| loop | instructions | added | instruction-cache misses | added |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


def run() -> str:
    per_iteration = {
        loop: (instructions(loop, 3) - instructions(loop, 1)) / (2 * ITERATIONS_PER_EPOCH) for loop in LOOPS
    }
    hand, ours = per_iteration["hand"], per_iteration["nbscale"]
    return "\n".join(
        [
            "## Training instructions per iteration (bench/count_train_instructions.py)",
            "",
            f"MLP 64-256-256-10, SGDM, mini-batch {BATCH}, one torch thread, no plots, counted by valgrind's "
            "callgrind.",
            "",
            "| loop | instructions per iteration |",
            "|---|---:|",
            f"| hand-written PyTorch loop | {hand:,.0f} |",
            f"| nbscale.train | {ours:,.0f} |",
            f"| hand / nbscale | {hand / ours:.3f}x |",
            "",
        ]
    )


if __name__ == "__main__":
    print(run_monitor() if sys.argv[1:] == ["monitor"] else run())
