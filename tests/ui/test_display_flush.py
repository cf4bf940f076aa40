"""Display messages flush only the streams that hold output, and keep their order with printed output."""

from __future__ import annotations

import io

import pytest

from nbscale.ui.display_flush import holds_output
from tests.kernel_session import KernelSession

CELL = """
import sys
from IPython.display import display
from nbscale.ui.display_flush import flush_only_waiting_streams
flush_only_waiting_streams()
flushes = []
_flush = sys.stdout.flush
sys.stdout.flush = lambda: (flushes.append(1), _flush())[1]
handle = display({"text/plain": "shown 0"}, raw=True, display_id=True)
for i in range(1, 4):
    handle.update({"text/plain": f"shown {i}"}, raw=True)  # nothing printed: no flush
quiet = len(flushes)
for i in range(4, 7):
    print(f"printed {i}", end="")  # waiting in the stream's buffer: flushed first
    handle.update({"text/plain": f"shown {i}"}, raw=True)
sys.stdout.flush = _flush
print(f" flushes: {quiet} then {len(flushes) - quiet}")
"""


def test_a_stream_that_is_not_ipykernels_counts_as_holding_output() -> None:
    assert holds_output(io.StringIO())


@pytest.mark.slow
def test_updates_flush_only_waiting_output_and_keep_the_printed_order(kernel: KernelSession) -> None:
    result = kernel.run(CELL)
    assert result.ok, result.text
    assert result.sequence == [
        "display_data: shown 0",
        *[f"update_display_data: shown {i}" for i in range(1, 4)],
        *[part for i in range(4, 7) for part in (f"stdout: printed {i}", f"update_display_data: shown {i}")],
        "stdout:  flushes: 0 then 3\n",
    ]
