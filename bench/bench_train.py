"""Training benchmarks, side by side in one run: nbscale.train against the same loop written by hand.

1. In the notebook's process on the CPU: `nbscale.train` (plots="training-progress", drawing in a real kernel)
   against a hand-written PyTorch loop with the same model, data, mini-batch and optimizer, in the same kernel.
2. On 2 CPU workers: execution_environment="parallel" against torch DDP written by hand
   (torch.multiprocessing spawn, gloo), same per-worker thread count as the pool's workers.
3. Where a GPU is visible: execution_environment="gpu" against the same hand-written loop on the GPU, and a
   small conv net trained with precision="single" and "mixed" (BENCH_GPU_ROWS_ON_CPU=1 runs these rows on
   the CPU, only to check the code).
nbscale and its peer run interleaved, REPEATS times each, so a busy moment on the (shared) machine hits both.
The table gives the best run of each (interference from other tenants only ever slows a run, so the best run is
the least disturbed one, as timeit reports its minimum), the ratio of medians, and the median of the pairs' ratios
(each nbscale run over the peer run beside it: drift of the machine's load between pairs cancels out); every run's
figure is printed too. Run: `python bench/bench_train.py`
(BENCH_EPOCHS, BENCH_MONITOR_EPOCHS, BENCH_BATCH, BENCH_PARALLEL_EPOCHS, BENCH_GPU_EPOCHS, BENCH_CONV_EPOCHS,
BENCH_CONV_SIZE and BENCH_REPEATS override the defaults; BENCH_ROWS=gpu, say, runs only the GPU rows; "metrics" is
metrics=("accuracy", "fscore") against the hand-written loop computing both each iteration; "monitor" a hand loop
with a TrainingMonitor, without it and with a stand-in, as whole runs and with their epochs interleaved in one cell
(INTERLEAVED: this VM's speed changes fall on all three alike); "plots" (plots on vs
none in the kernel) and "pool1" (a pool of one CPU worker vs in-process) are rows to ask for). The in-process runs
are long enough (~10 s on 2 cores) for the progress figure to update during training, not only before and after
it; the table says how many times it did.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

EPOCHS = int(os.environ.get("BENCH_EPOCHS", 150))  # in the notebook's process
MONITOR_EPOCHS = int(os.environ.get("BENCH_MONITOR_EPOCHS", 300))  # TrainingMonitor rows: ~14 s runs to tell 1%
PARALLEL_EPOCHS = int(os.environ.get("BENCH_PARALLEL_EPOCHS", 40))  # on the pool and with hand-written DDP
BATCH = int(os.environ.get("BENCH_BATCH", 64))
REPEATS = int(os.environ.get("BENCH_REPEATS", 8))
GPU_EPOCHS = int(os.environ.get("BENCH_GPU_EPOCHS", 50))  # the MLP on a GPU
CONV_EPOCHS = int(os.environ.get("BENCH_CONV_EPOCHS", 10))  # the conv net on a GPU, single and mixed precision
CONV_SIZE = int(os.environ.get("BENCH_CONV_SIZE", 64))  # its images' side (a multiple of 8)
ROWS = os.environ.get("BENCH_ROWS", "cpu,metrics,monitor,parallel,gpu").split(",")  # which runs (gpu rows need a GPU)
WORKERS = 2

SETUP = f"""
import time, torch
from torch import nn
import nbscale
from sklearn.datasets import load_digits
d = load_digits()
X = (torch.tensor(d.data, dtype=torch.float32) / 16).repeat(4, 1)
Y = torch.tensor(d.target).repeat(4)
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
EPOCHS, BATCH = {EPOCHS}, {BATCH}
cpu = torch.device("cpu")
"""

# one iteration of the hand-written loop (inside `for i in range(len({x}) // BATCH):`)
ITERATION = """        index = order[i * BATCH:(i + 1) * BATCH]
        x, y = {x}[index], {y}[index]
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        images += len(y)
        last_loss = loss.item()
"""

HAND_WRITTEN = (
    """
model = make_model().to({device})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
if {device}.type == "cuda": torch.cuda.synchronize()
started = time.perf_counter(); images = 0
for epoch in range({epochs}):
    order = torch.randperm(len({x}), device={device})
    for i in range(len({x}) // BATCH):
"""
    + ITERATION
    + """{rate} = images / (time.perf_counter() - started)
"""
)

# a user's own loop calls the monitor after each iteration (as API.md shows it)
MONITOR_CALLS = """        step += 1
        monitor.record(step, loss=loss)
        monitor.update_info(epoch=epoch + 1)
        monitor.progress = 100 * step / total
        if monitor.stop:
            break
"""
NEW_MONITOR = """nbscale.TrainingMonitor(
    metrics=["loss"], info=["epoch"], x_label="iteration")"""
# a stand-in with the monitor's four names that does nothing: what the calls themselves cost
STAND_IN_CLASS = """class StandIn:
    stop, progress = False, None
    def record(self, step, **values): pass
    def update_info(self, **values): pass
"""

# the same hand loop followed by a TrainingMonitor (figure, info panel, Stop), as a user's own loop uses it
MONITORED = HAND_WRITTEN.replace(
    "started = time.perf_counter(); images = 0",
    f"""monitor = {NEW_MONITOR}
total = {{epochs}} * (len({{x}}) // BATCH); step = 0
started = time.perf_counter(); images = 0""",
).replace(ITERATION, ITERATION + MONITOR_CALLS)

# the same loop calling the stand-in
STAND_IN = MONITORED.replace(f"monitor = {NEW_MONITOR}", STAND_IN_CLASS + "monitor = StandIn()")

# the three loops' epochs interleaved in one cell, the order turned every cycle: a change of the machine's speed
# (this VM's neighbours move it by 30% within minutes) falls on all three alike. One monitor draws throughout; its
# reads and draws are timed (by wrapping its _flush) to count them apart: their budget is a share of the wall
# time, so in epochs that are a third of it they weigh three times what they do in a loop of its own.
EPOCH_FUNCTION = """
def {name}(epoch, step, monitor, total):
    order = torch.randperm(len(X)); images = 0
    for i in range(len(X) // BATCH):
"""
INTERLEAVED = (
    STAND_IN_CLASS
    + EPOCH_FUNCTION.format(name="hand_epoch")
    + ITERATION.format(x="X", y="Y")
    + "    return step\n"
    + "".join(
        EPOCH_FUNCTION.format(name=name) + ITERATION.format(x="X", y="Y") + MONITOR_CALLS + "    return step\n"
        for name in ("monitored_epoch", "stand_in_epoch")
    )
    + "\nimport statistics\nmonitor = "
    + NEW_MONITOR
    + """
flush, drawing = monitor._flush, [0.0]
def timed_flush(*args, **kwargs):
    started = time.perf_counter(); flush(*args, **kwargs); drawing[0] += time.perf_counter() - started
monitor._flush = timed_flush
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
variants = [("hand", hand_epoch, None), ("monitor", monitored_epoch, monitor), ("stand-in", stand_in_epoch, StandIn())]
times, steps = {{name: [] for name, *_ in variants}}, {{name: 0 for name, *_ in variants}}
total = {epochs} // 3 * (len(X) // BATCH)
wall_started = time.perf_counter()
for e in range({epochs}):
    name, epoch_of, watcher = variants[(e + e // 3) % 3]
    started = time.perf_counter()
    steps[name] = epoch_of(e // 3, steps[name], watcher, total)
    times[name].append(time.perf_counter() - started)
wall = time.perf_counter() - wall_started
def per_cycle(name):
    return statistics.median(h / t for h, t in zip(times["hand"], times[name]))
monitor_cycle, stand_in_cycle, drawn_share = per_cycle("monitor"), per_cycle("stand-in"), drawing[0] / wall
hand_rate = len(X) // BATCH * BATCH / statistics.median(times["hand"])
"""
)

NBSCALE = """
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, momentum=0.9, l2_regularization=0.0,
    max_epochs={epochs}, mini_batch_size=BATCH, shuffle="every-epoch", plots="{plots}",
    verbose=False, execution_environment="{env}")
started = time.perf_counter()
net, info = nbscale.train(make_model(), (X, Y), options)
nbscale_wall_rate = info.iteration[-1] * BATCH / (time.perf_counter() - started)
nbscale_rate = info.images_per_second  # the loop's own time, plot updates included, like hand_rate
"""

# the same loop computing what metrics=("accuracy", "fscore") shows: each iteration's accuracy and macro F-score
# (over the classes in its labels or predictions), read with its loss in one copy to the host per iteration
HAND_METRICS = """
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
started = time.perf_counter(); images = 0; history = []
for epoch in range(EPOCHS):
    order = torch.randperm(len(X))
    for i in range(len(X) // BATCH):
        index = order[i * BATCH:(i + 1) * BATCH]
        x, y = X[index], Y[index]
        outputs = model(x)
        loss = loss_fn(outputs, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        predicted = outputs.detach().argmax(1)
        true_positives = torch.bincount(y[predicted == y], minlength=10)
        counts = torch.stack([true_positives, torch.bincount(predicted, minlength=10) - true_positives,
                              torch.bincount(y, minlength=10) - true_positives])
        tp, fp, fn = counts.tolist()
        seen = [(t, p, n) for t, p, n in zip(tp, fp, fn) if t + p + n]
        history.append((loss.item(), sum(tp) / len(y), sum(2 * t / (2 * t + p + n) for t, p, n in seen) / len(seen)))
        images += len(y)
hand_metrics_rate = images / (time.perf_counter() - started)
"""

NBSCALE_METRICS = """
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, momentum=0.9, l2_regularization=0.0,
    max_epochs=EPOCHS, mini_batch_size=BATCH, shuffle="every-epoch", plots="training-progress",
    verbose=False, execution_environment="cpu", metrics=("accuracy", "fscore"))
net, info = nbscale.train(make_model(), (X, Y), options)
nbscale_metrics_rate = info.images_per_second
metrics_computed = "fscore" in (getattr(info, "metrics", None) or {})
"""

GPU_SETUP = """
gpu = torch.device("cuda" if torch.cuda.is_available() else "cpu")
Xg, Yg = X.to(gpu), Y.to(gpu)
d_images = torch.nn.functional.interpolate(torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16,
                                           size={size}).repeat(4, 3, 1, 1)
conv_data = (d_images, Y.clone())
def make_conv():
    torch.manual_seed(0)
    block = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
    return nn.Sequential(block(3, 64), block(64, 128), block(128, 256), nn.Flatten(),
                         nn.Linear(256 * {size} ** 2 // 64, 10))
"""

NBSCALE_GPU = """
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, momentum=0.9, l2_regularization=0.0,
    max_epochs={epochs}, mini_batch_size=BATCH, shuffle="every-epoch", plots="training-progress",
    verbose=False, execution_environment="{env}")
net, info = nbscale.train(make_model(), (Xg, Yg), options)
nbscale_gpu_rate = info.images_per_second
"""

CONV = """
options = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, momentum=0.9, max_epochs={epochs},
    mini_batch_size=256, plots="none", verbose=False, execution_environment="{env}", precision="{precision}")
net, info = nbscale.train(make_conv(), conv_data, options)
conv_rate = info.images_per_second
"""


def _measured(kernel, code: str, name: str, timeout: float = 600) -> tuple[float, object]:
    """Run `code` in the kernel and read the images/s it left in `name`; each run is told on stderr as it ends."""
    started = time.perf_counter()
    result = kernel.run(code, timeout=timeout)
    if not result.ok:
        raise RuntimeError(result.text)
    value = _value(kernel, name)
    print(f"{name}: {value:,.0f} images/s ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return value, result


def _value(kernel, name: str) -> float:
    result = kernel.run(f"print(repr({name}))")
    if not result.ok:
        raise RuntimeError(result.text)
    return float(result.stdout.strip())


def _ddp_worker(rank: int, world: int, port: int, threads: int, queue) -> None:
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from torch import nn

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    d = load_digits()
    inputs = (torch.tensor(d.data, dtype=torch.float32) / 16).repeat(4, 1)
    labels = torch.tensor(d.target).repeat(4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    net = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    local = BATCH // world
    started, images = time.perf_counter(), 0
    for epoch in range(PARALLEL_EPOCHS):
        order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(epoch))
        for i in range(len(inputs) // BATCH):
            index = order[i * BATCH + rank * local : i * BATCH + (rank + 1) * local]
            loss = loss_fn(net(inputs[index]), labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            reported = loss.detach().clone()
            dist.all_reduce(reported)  # the global loss, as a progress display would need it
            images += BATCH
    if rank == 0:
        queue.put(images / (time.perf_counter() - started))
    dist.destroy_process_group()


def hand_ddp_rate(attempts: int = 3) -> float:
    """The hand-written DDP run (retried: a gloo rendezvous on a loaded machine now and then aborts)."""
    for attempt in range(attempts):
        try:
            return _hand_ddp_rate_once()
        except Exception:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _hand_ddp_rate_once() -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    threads = max(1, (os.cpu_count() or 1) // WORKERS)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_ddp_worker, args=(WORKERS, port, threads, queue), nprocs=WORKERS, start_method="spawn")
    return queue.get()


def run() -> str:
    """Measure and return the markdown section."""
    from tests.kernel_session import KernelSession

    kernel = KernelSession()
    runs: dict[str, list[float]] = {}
    updates: list[int] = []
    tables: list[str] = []  # after the table of whole runs
    try:
        kernel.run("%load_ext nbscale")
        setup = kernel.run(SETUP)
        if not setup.ok:
            raise RuntimeError(setup.text)
        rows = []
        if "cpu" in ROWS:
            rows += _in_process_rows(kernel, runs, updates)
        if "monitor" in ROWS:
            tables += _interleaved_monitor_table(kernel)
            rows += _monitor_rows(kernel, runs)
        if "plots" in ROWS:
            rows += _plot_rows(kernel, runs, updates)
        if "parallel" in ROWS:
            rows += _parallel_rows(kernel, runs)
        if "pool1" in ROWS:
            rows += _one_worker_rows(kernel, runs)
        if "metrics" in ROWS:
            rows += _metrics_rows(kernel, runs)
        if "gpu" in ROWS:
            rows += _gpu_rows(kernel, runs)
    finally:
        kernel.shutdown()
    drawn = (
        f" With plots on, the progress figure updated {min(updates)} to {max(updates)} times during each "
        "in-process run (besides the empty figure before it and the final one after it)."
        if updates
        else ""
    )
    return "\n".join(
        [
            "## Training (bench/bench_train.py)",
            "",
            f"digits x4 (7188 samples), MLP 64-256-256-10, SGDM, mini-batch {BATCH}, {EPOCHS} epochs in the "
            f"notebook's process ({PARALLEL_EPOCHS} on 2 workers); best of {REPEATS} interleaved runs "
            f"(ratios of medians and pairs beside it); {os.cpu_count()} CPU cores, torch {torch.__version__}.{drawn}",
            "",
            "| run | nbscale images/s (best) | peer images/s (best) | ratio of best | ratio of medians "
            "| median pair ratio |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Every run (images/s): "
            + "; ".join(f"{name} {', '.join(f'{v:,.0f}' for v in values)}" for name, values in runs.items()),
            "",
            *tables,
        ]
    )


def _in_process_rows(kernel, runs: dict[str, list[float]], updates: list[int]) -> list[str]:
    """nbscale.train on the CPU in the kernel's process against the hand-written loop, interleaved."""
    hand, ours, wall = runs.setdefault("hand", []), runs.setdefault("ours", []), runs.setdefault("wall", [])
    for _ in range(REPEATS):  # interleaved, so a busy moment on the machine hits both
        hand.append(
            _measured(
                kernel, HAND_WRITTEN.format(device="cpu", x="X", y="Y", rate="hand_rate", epochs="EPOCHS"), "hand_rate"
            )[0]
        )
        rate, result = _measured(
            kernel, NBSCALE.format(env="cpu", epochs="EPOCHS", plots="training-progress"), "nbscale_rate"
        )
        ours.append(rate)
        updates.append(_updates_during_training(result))
        wall.append(_value(kernel, "nbscale_wall_rate"))
    return [
        _row("CPU, notebook process, plots on, vs hand-written loop", ours, hand),
        _row("same, end to end (setup, widgets, final figure included)", wall, hand),
    ]


def _metrics_rows(kernel, runs: dict[str, list[float]]) -> list[str]:
    """nbscale.train with metrics=("accuracy", "fscore") against the hand-written loop computing the same."""
    hand, ours = runs.setdefault("hand metrics", []), runs.setdefault("ours metrics", [])
    label = "CPU, notebook process, plots on, metrics accuracy and fscore, vs hand-written loop computing them"
    for _ in range(REPEATS):
        hand.append(_measured(kernel, HAND_METRICS, "hand_metrics_rate")[0])
        ours.append(_measured(kernel, NBSCALE_METRICS, "nbscale_metrics_rate")[0])
        if not _value(kernel, "int(metrics_computed)"):  # before the loop computes them, a bare run is no figure
            return [f"| {label} | not measured: nbscale.train does not compute metrics=... yet | | | | |"]
    return [_row(label, ours, hand)]


def _interleaved_monitor_table(kernel) -> list[str]:
    """The hand loop, the monitored loop and the stand-in's, epoch by epoch in one cell (INTERLEAVED), REPEATS
    // 2 times: per run the median over cycles of the hand epoch's time over the other's, and the monitor's reads
    and draws as a share of the wall time (the share a loop of its own gives them)."""
    monitored: list[float] = []
    called: list[float] = []
    drawn: list[float] = []
    rates: list[float] = []
    for _ in range(max(1, REPEATS // 2)):
        result = kernel.run(INTERLEAVED.format(epochs=3 * MONITOR_EPOCHS), timeout=900)
        if not result.ok:
            raise RuntimeError(result.text)
        for name, kept in (
            ("monitor_cycle", monitored),
            ("stand_in_cycle", called),
            ("drawn_share", drawn),
            ("hand_rate", rates),
        ):
            kept.append(_value(kernel, name))
        print(f"interleaved: monitor {monitored[-1]:.4f}, stand-in {called[-1]:.4f}", file=sys.stderr, flush=True)
    cost = [1 - ratio + share for ratio, share in zip(monitored, drawn, strict=True)]
    runs = ", ".join(f"{ratio:.4f}" for ratio in monitored)
    return [
        f"The same loops with their epochs interleaved in one cell ({MONITOR_EPOCHS} epochs each, the order turned "
        f"every cycle; {len(cost)} runs, the hand loop's median epoch at "
        f"{', '.join(f'{rate:,.0f}' for rate in rates)} images/s): the cost is 1 - the median over cycles of the "
        "hand epoch's time over the monitored one's, plus the monitor's reads and draws as a share of the wall "
        "time (in epochs that are a third of it they weigh three times that).",
        "",
        "| loop | median epoch ratio per cycle (runs) | reads and draws, share of the wall time | cost (median run) |",
        "|---|---:|---:|---:|",
        f"| hand-written loop with nbscale.TrainingMonitor vs without | {statistics.median(monitored):.4f} ({runs}) "
        f"| {statistics.median(drawn):.2%} | {statistics.median(cost):.2%} |",
        f"| the same, calls to a stand-in that does nothing | {statistics.median(called):.4f} | - | "
        f"{1 - statistics.median(called):.2%} |",
        "",
    ]


def _monitor_rows(kernel, runs: dict[str, list[float]]) -> list[str]:
    """The hand-written loop with a TrainingMonitor against without it, and against the same loop calling a stand-in
    that does nothing (the floor of four Python calls an iteration), interleaved in the same kernel."""
    hand, watched = runs.setdefault("hand, no monitor", []), runs.setdefault("hand + monitor", [])
    called = runs.setdefault("hand + stand-in doing nothing", [])
    variants = (
        (HAND_WRITTEN, "hand_rate", hand),
        (MONITORED, "monitored_rate", watched),
        (STAND_IN, "stand_in_rate", called),
    )
    for repeat in range(REPEATS):  # every other repeat in the reverse order: no variant always runs first or last
        for code, name, rates in variants if repeat % 2 == 0 else variants[::-1]:
            formatted = code.format(device="cpu", x="X", y="Y", rate=name, epochs=MONITOR_EPOCHS)
            rates.append(_measured(kernel, formatted, name)[0])
    return [
        _row(
            f"CPU hand-written loop ({MONITOR_EPOCHS} epochs) with nbscale.TrainingMonitor vs without (the monitor's "
            "cost)",
            watched,
            hand,
        ),
        _row("the same, calls to a stand-in that does nothing vs without (the calls' own cost)", called, hand),
        _row(
            "CPU hand-written loop with nbscale.TrainingMonitor vs with the stand-in (nbscale's part)", watched, called
        ),
    ]


def _plot_rows(kernel, runs: dict[str, list[float]], updates: list[int]) -> list[str]:
    """nbscale.train in the kernel's process with the progress figure and info panel against without them."""
    shown, hidden = runs.setdefault("plots on", []), runs.setdefault("plots none", [])
    shown_wall, hidden_wall = runs.setdefault("plots on, wall", []), runs.setdefault("plots none, wall", [])
    for _ in range(REPEATS):
        for plots, loop, wall in (("training-progress", shown, shown_wall), ("none", hidden, hidden_wall)):
            rate, result = _measured(kernel, NBSCALE.format(env="cpu", epochs="EPOCHS", plots=plots), "nbscale_rate")
            loop.append(rate)
            wall.append(_value(kernel, "nbscale_wall_rate"))
            if plots != "none":
                updates.append(_updates_during_training(result))
    return [
        _row("CPU, notebook process, plots on vs plots none (the figure's and info panel's cost)", shown, hidden),
        _row("same, whole calls (the empty figure, widgets and final figure included)", shown_wall, hidden_wall),
    ]


def _one_worker_rows(kernel, runs: dict[str, list[float]]) -> list[str]:
    """execution_environment="parallel" on a pool of 1 CPU worker (all cores' threads) against in-process."""
    kernel.run("pool = nbscale.Pool(1, cpu=True)", timeout=180)
    one, alone = runs.setdefault("pool of 1", []), runs.setdefault("in-process", [])
    one_wall, alone_wall = runs.setdefault("pool of 1, wall", []), runs.setdefault("in-process, wall", [])
    for _ in range(REPEATS):
        for env, loop, wall in (("parallel", one, one_wall), ("cpu", alone, alone_wall)):
            loop.append(
                _measured(
                    kernel, NBSCALE.format(env=env, epochs=PARALLEL_EPOCHS, plots="none"), "nbscale_rate", timeout=300
                )[0]
            )
            wall.append(_value(kernel, "nbscale_wall_rate"))
    kernel.run("pool.close()")
    return [
        _row(
            f"parallel, pool of 1 CPU worker ({os.cpu_count()} threads) vs in-process, {PARALLEL_EPOCHS} "
            "epochs, plots none (training-loop time)",
            one,
            alone,
        ),
        _row("same, whole calls (sending the job, start, weights back included)", one_wall, alone_wall),
    ]


def _parallel_rows(kernel, runs: dict[str, list[float]]) -> list[str]:
    """execution_environment="parallel" on 2 CPU workers against hand-written DDP, interleaved."""
    kernel.run(f"pool = nbscale.Pool({WORKERS}, cpu=True)", timeout=180)
    parallel, ddp = runs.setdefault("parallel", []), runs.setdefault("ddp", [])
    for _ in range(REPEATS):  # interleaved too: the hand-written DDP runs while the pool idles
        parallel.append(
            _measured(
                kernel,
                NBSCALE.format(env="parallel", epochs=PARALLEL_EPOCHS, plots="training-progress"),
                "info.images_per_second",
                timeout=300,
            )[0]
        )
        ddp.append(hand_ddp_rate())
    kernel.run("pool.close()")
    return [_row(f"parallel, {WORKERS} CPU workers (gloo) vs hand-written DDP (training-loop time)", parallel, ddp)]


def _gpu_rows(kernel, runs: dict[str, list[float]]) -> list[str]:  # kernel: a KernelSession
    """Rows for "gpu" vs the hand-written loop and "mixed" vs "single" (none without a GPU)."""
    on_cpu = os.environ.get("BENCH_GPU_ROWS_ON_CPU") == "1"
    if not (torch.cuda.is_available() or on_cpu):
        return []
    setup = kernel.run(GPU_SETUP.format(size=CONV_SIZE), timeout=300)
    if not setup.ok:
        raise RuntimeError(setup.text)
    env = "gpu" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (code check only)"
    hand, ours = runs.setdefault("hand gpu", []), runs.setdefault("ours gpu", [])
    single, mixed = runs.setdefault("conv single", []), runs.setdefault("conv mixed", [])
    conv_epochs, gpu_epochs = (1, 2) if on_cpu else (CONV_EPOCHS, GPU_EPOCHS)
    for _ in range(REPEATS):
        hand_loop = HAND_WRITTEN.format(device="gpu", x="Xg", y="Yg", rate="hand_gpu_rate", epochs=gpu_epochs)
        for code, values, value in (
            (hand_loop, hand, "hand_gpu_rate"),
            (NBSCALE_GPU.format(env=env, epochs=gpu_epochs), ours, "nbscale_gpu_rate"),
            (CONV.format(env=env, precision="single", epochs=conv_epochs), single, "conv_rate"),
            (CONV.format(env=env, precision="mixed", epochs=conv_epochs), mixed, "conv_rate"),
        ):
            values.append(_measured(kernel, code, value)[0])
    return [
        _row(f"gpu ({name}), MLP as above, {GPU_EPOCHS} epochs, plots on, vs hand-written loop on the GPU", ours, hand),
        _row(
            f"mixed vs single precision ({name}), conv net 64-128-256 on {CONV_SIZE}x{CONV_SIZE}x3, mini-batch 256",
            mixed,
            single,
        ),
    ]


def _updates_during_training(result) -> int:  # result: a tests.kernel_session.CellResult
    """Figure updates a run showed between the empty figure before its first iteration and the final one."""
    return sum("image/png" in shown for shown in result.displays) - 2


def _row(label: str, ours: list[float], peer: list[float]) -> str:
    pairs = statistics.median(a / b for a, b in zip(ours, peer, strict=True))
    return (
        f"| {label} | {max(ours):,.0f} | {max(peer):,.0f} | {max(ours) / max(peer):.2f}x | "
        f"{statistics.median(ours) / statistics.median(peer):.2f}x | {pairs:.2f}x |"
    )


if __name__ == "__main__":
    print(run())
