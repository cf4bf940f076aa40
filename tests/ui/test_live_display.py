"""The live display stays live (issue 42): in a real kernel, while a fast loop trains for several seconds, the
info panel's Iteration row changes at least every second and the figure is redrawn at least every 2 s, for
nbscale.train and a TrainingMonitor. Timing is the feature here, so the bounds are the issue's."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.kernel_session import CellResult, KernelSession, kernel_after

pytestmark = pytest.mark.slow

RUN_SECONDS = 8  # long enough for a dozen info updates and several figures
# the bounds (the display's clocks run at 0.5 s and 1-1.5 s), plus slack: the gaps are measured at the times
# the kernel sent its messages, which a busy machine (make test runs 4 test processes on 2 cores) delays by a few
# hundred milliseconds (a figure gap of 2.004 s was seen there)
BUSY_MACHINE_SLACK_S = 0.5
INFO_STALE_S = 1.0 + BUSY_MACHINE_SLACK_S
FIGURE_STALE_S = 2.0 + BUSY_MACHINE_SLACK_S
SETUP = """
%load_ext nbscale
import time, torch, nbscale
from tests.training.digits import digits, tiny_net
torch.set_num_threads(1)  # a fast loop: two threads on a busy 2-core machine wait on each other (40 ms an iteration)

def for_seconds(seconds):
    # an output_fn that stops training `seconds` after its first iteration
    first = []
    def stop(info):
        first.append(time.time())
        return time.time() - first[0] > seconds
    return stop
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelSession]:
    with kernel_after(SETUP) as session:
        yield session


def changes(result: CellResult, row: str) -> list[tuple[float, str]]:
    """(when the kernel sent it, the row's value) each time the info panel's `row` showed a new value."""
    seen: list[tuple[float, str]] = []
    for when, data in zip(result.shown_at, result.displays, strict=True):
        found = re.search(rf"^{row}: (.*)$", data.get("text/plain", ""), re.MULTILINE)
        if found and (not seen or seen[-1][1] != found.group(1)):
            seen.append((when, found.group(1)))
    return seen


def figure_times(result: CellResult) -> list[float]:
    return [when for when, data in zip(result.shown_at, result.displays, strict=True) if "image/png" in data]


def longest_gap(times: list[float]) -> float:
    return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


def test_train_s_iteration_row_changes_every_second_and_its_figure_every_two(kernel: KernelSession) -> None:
    result = kernel.run(f"""
(train_x, train_y), val = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=10_000, mini_batch_size=16, verbose=False,
                               plots="training-progress", output_fn=for_seconds({RUN_SECONDS}))
net, info = nbscale.train(tiny_net(), (train_x, train_y), opts)
print("trained", info.iteration[-1])
""")
    assert result.ok, result.text
    assert_stays_live(result, changes(result, "Iteration"))


def test_train_s_elapsed_row_moves_while_one_iteration_takes_seconds(kernel: KernelSession) -> None:
    # three iterations of ~2.5 s each: the panel is redrawn between them (nbscale.ui.panel_ticker), not only when
    # an iteration ends
    result = kernel.run("""
class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = tiny_net()
    def forward(self, x):
        time.sleep(2.5)
        return self.net(x)

(train_x, train_y), _ = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=1, mini_batch_size=64, verbose=False, plots="training-progress")
net, info = nbscale.train(Slow(), (train_x[:192], train_y[:192]), opts)
print("trained", info.iteration[-1])
""")
    assert result.ok, result.text
    assert "trained 3" in result.stdout, result.stdout
    elapsed = changes(result, "Elapsed")
    training = [when for when, _ in elapsed]
    assert training[-1] - training[0] >= 5, elapsed  # the run itself: three slow iterations
    assert longest_gap(training) <= INFO_STALE_S, elapsed


def test_a_monitor_s_step_row_changes_every_second_and_its_figure_every_two(kernel: KernelSession) -> None:
    result = kernel.run(f"""
(train_x, train_y), _ = digits()
net = tiny_net()
monitor = nbscale.TrainingMonitor(metrics=["loss"], info=["epoch"])
monitor.status = "Training the digits"
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
started, step = time.time(), 0
while time.time() - started < {RUN_SECONDS}:
    for start in range(0, 1500, 16):
        loss = torch.nn.functional.cross_entropy(net(train_x[start:start + 16]), train_y[start:start + 16])
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        step += 1
        monitor.record(step, loss=loss)
    monitor.update_info(epoch=step // 94)
monitor.close()
""")
    assert result.ok, result.text
    assert changes(result, "Status")[-1][1] == "Training the digits"  # monitor.status is shown
    assert_stays_live(result, changes(result, "Iteration"))


def assert_stays_live(
    result: CellResult, iterations: list[tuple[float, str]], gaps_until: int | None = None, shown: object = None
) -> None:
    """The Iteration row changed (`iterations`, from `changes`) at least RUN_SECONDS times, never more than
    INFO_STALE_S apart (among `iterations[:gaps_until]`), and the figure followed from its first change on.
    `shown`: what a failure shows (default: `iterations`)."""
    shown = iterations if shown is None else shown
    assert len(iterations) >= RUN_SECONDS, shown
    assert longest_gap([when for when, _ in iterations[:gaps_until]]) <= INFO_STALE_S, shown
    assert_figure_follows(figure_times(result), iterations[0][0])


def assert_figure_follows(figures: list[float], first_iteration: float) -> None:
    """The figure was redrawn at least every FIGURE_STALE_S from the first iteration on (the first figure with
    points too: not 12 s in)."""
    training = [when for when in figures if when >= first_iteration]  # not the empty figure shown before
    assert len(training) >= RUN_SECONDS // 2, figures
    assert longest_gap([first_iteration, *training]) <= FIGURE_STALE_S, (first_iteration, figures)


def test_job_show_s_iteration_row_changes_every_second_and_its_figure_every_two(kernel: KernelSession) -> None:
    from tests.jobs.test_batch_magic import submitted_id

    submitted = kernel.run(f"""%%batch --name live
import time, torch, nbscale
from tests.training.digits import digits, tiny_net
torch.set_num_threads(1)
(x, y), _ = digits()
first = []
def stop(info):
    first.append(time.time())
    return time.time() - first[0] > {2 * RUN_SECONDS}  # shown while it runs: it started before the show
opts = nbscale.TrainingOptions("sgdm", max_epochs=10_000, mini_batch_size=16, verbose=False, output_fn=stop)
net, info = nbscale.train(tiny_net(), (x, y), opts)
""")
    assert submitted.ok, submitted.text
    result = kernel.run(f"%jobs show {submitted_id(submitted.stdout)} --wait", timeout=180)
    assert result.ok, result.text
    iterations = changes(result, "Iteration")
    following = [(when, shown) for when, shown in iterations if not shown.startswith(("0 ", "1 "))]
    assert_stays_live(result, following, gaps_until=-1, shown=iterations)  # the last change: its end


def test_show_run_s_iteration_row_changes_every_second_and_its_figure_every_two(kernel: KernelSession) -> None:
    assert kernel.run("%pool start 1 --cpu", timeout=180).ok
    assert kernel.run("%%spmd\nimport torch\ntorch.set_num_threads(1)").ok  # a fast loop, as SETUP's
    started = kernel.run("""
(train_x, train_y), _ = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=10_000, mini_batch_size=16, verbose=False)
run = nbscale.train_async(tiny_net(), (train_x, train_y), opts)
nbscale.show(run)
""")
    assert started.ok, started.text
    assert "RunProgress" not in started.text  # as a cell's last line: the display, no repr under it
    # the display's thread draws into the cell that runs (nbscale.ui.cell_outputs): this one, while it waits
    result = kernel.run(f"while not run.info.iteration: time.sleep(0.05)\ntime.sleep({RUN_SECONDS})\nrun.stop()")
    assert result.ok, result.text
    assert_stays_live(result, changes(result, "Iteration"))


def test_after_an_early_stop_the_iteration_axis_spans_what_ran(kernel: KernelSession) -> None:
    result = kernel.run("""
from nbscale.training.events import IterationDone, StopSignal, TrainingDone, TrainingStarted
from nbscale.ui.progress import TrainingProgress
progress = TrainingProgress(StopSignal())
progress(TrainingStarted(10, 100, 8, "cpu", time.time()))
for i in range(1, 38):
    progress(IterationDone(1, i, 0.01 * i, 1.0 / i, 0.5, 0.01, 8 * i, training_metrics={"accuracy": 0.5}))
figure = progress._figure
print(tuple(map(float, figure.loss_axes.get_xlim())))
progress(TrainingDone("Stopped by request", 1, 37, 0.37, 37, 800.0))
print(tuple(map(float, figure.loss_axes.get_xlim())))
""")
    assert result.ok, result.text
    assert result.stdout.split("\n")[:2] == ["(0.0, 1000.0)", "(0.0, 37.0)"], result.stdout
