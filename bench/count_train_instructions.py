"""Instructions per training iteration, nbscale.train against the hand-written loop, counted by valgrind.

Wall-clock ratios on a shared VM move by several percent from run to run (bench_train.py); instruction counts do
not. Each loop runs under `valgrind --tool=callgrind` for 1 and for 3 epochs of the MLP of bench_train.py (one
torch thread, no plots); the difference divided by the iterations of 2 epochs is the cost of one iteration, start-up
and imports cancelled out (start-up varies by tens of millions of instructions between runs, so the estimate is
within about +-3%). Takes ~15 minutes (valgrind runs Python ~50x slower). Run:
`python bench/count_train_instructions.py` (needs valgrind: `apt-get install valgrind`).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

BATCH, SAMPLES = 64, 7188
ITERATIONS_PER_EPOCH = SAMPLES // BATCH

LOOPS = {
    "hand": """
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(EPOCHS):
    order = torch.randperm(len(X))
    for i in range(len(X) // BATCH):
        index = order[i * BATCH:(i + 1) * BATCH]
        x, y = X[index], Y[index]
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last_loss = loss.item()
""",
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
    print(run())
