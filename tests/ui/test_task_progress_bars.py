"""`pool.map(..., progress=True)` and `nbscale.show([futures])` in a real kernel: a done/total bar under the cell,
updated in place (one display, then its updates), whose last state says what happened."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.kernel_session import KernelSession

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelSession]:
    session = KernelSession()
    started = session.run("import nbscale, time\npool = nbscale.Pool(2, cpu=True)", timeout=180)
    assert started.ok, started.text
    yield session
    session.close("pool.close()", timeout=60)


def _bars(result_displays: list[dict[str, str]], label: str) -> list[str]:
    return [shown["text/plain"] for shown in result_displays if shown.get("text/plain", "").startswith(label)]


def test_pool_map_with_progress_shows_a_bar_that_ends_at_done_over_total(kernel: KernelSession) -> None:
    result = kernel.run("print(list(pool.map(abs, range(-6, 6), progress=True)))")
    assert result.ok, result.text
    assert "[6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5]" in result.stdout
    bars = _bars(result.displays, "pool.map:")
    assert bars[0].startswith("pool.map:   0%|          | 0/12 [00:00<?"), bars
    assert re.match(r"pool\.map: 100%\|##########\| 12/12 \[\d\d:\d\d<00:00, [\d.]+it/s\]$", bars[-1]), bars
    html = [shown["text/html"] for shown in result.displays if "pool.map" in shown.get("text/html", "")]
    assert '<progress value="12" max="12"></progress>' in html[-1]


def test_pool_map_without_a_length_counts_done_items_only(kernel: KernelSession) -> None:
    result = kernel.run("print(sum(pool.map(abs, (x for x in range(-3, 3)), progress=True)))")
    assert result.ok, result.text
    assert result.stdout.strip() == "9"
    assert re.match(r"pool\.map: 6 done \[\d\d:\d\d, [\d.]+it/s\]$", _bars(result.displays, "pool.map:")[-1])


def test_pool_map_without_progress_shows_nothing(kernel: KernelSession) -> None:
    result = kernel.run("print(list(pool.map(abs, [-1, -2])))")
    assert result.ok and not result.displays, result.text


def test_a_failing_map_item_leaves_the_bar_where_it_stopped_with_the_failure_counted(kernel: KernelSession) -> None:
    result = kernel.run("list(pool.map(divmod, [4, 6, 8], [2, 0, 2], progress=True))")
    assert result.error_name == "WorkerError", result.text
    last = _bars(result.displays, "pool.map:")[-1]
    # 4/2 done, 6/0 failed; 8/2 done or cancelled by the failure, depending on whether it had ended
    assert re.search(r"\| (2/3 \[.*, 1 failed, 1 cancelled|3/3 \[.*, 1 failed)\]$", last), last
    html = [shown["text/html"] for shown in result.displays if "pool.map" in shown.get("text/html", "")]
    assert "color: #d9534f" in html[-1]


def test_show_of_a_list_of_submitted_futures_fills_a_bar_as_they_end(kernel: KernelSession) -> None:
    code = (
        "futures = [pool.submit(pow, 2, n) for n in range(8)]\n"
        "bar = nbscale.show(futures)\n"
        "deadline = time.monotonic() + 60\n"
        "while bar.done < len(futures) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"  # poll the state the receiver thread sets, with a deadline
        "print([f.result() for f in futures])"
    )
    result = kernel.run(code)
    assert result.ok, result.text
    assert "[1, 2, 4, 8, 16, 32, 64, 128]" in result.stdout
    assert _bars(result.displays, "tasks:")[-1].startswith("tasks: 100%|##########| 8/8 ["), result.displays


def test_show_of_a_list_holding_something_else_names_it(kernel: KernelSession) -> None:
    result = kernel.run("nbscale.show([pool.submit(abs, -1), 3])")
    assert result.error_name == "NbscaleError", result.text
    assert "this list also holds int. Pass only the futures." in result.error_value
