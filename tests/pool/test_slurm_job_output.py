"""What a SLURM pool's allocation writes to its job output, and how the kernel reads it (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nbscale.pool.backends.slurm import _head_address
from nbscale.pool.backends.slurm_allocation import ADDRESS_MARK


def test_the_heads_address_is_read_even_with_another_nodes_words_glued_to_its_line(tmp_path: Path) -> None:
    output = tmp_path / "nbscale-pool-1.out"
    output.write_text(f"Ray runtime started.\n{ADDRESS_MARK} 127.0.0.1:6379 127.0.0.1:10001Local node IP: x\n\n")
    assert _head_address(output) == "127.0.0.1:6379"
    output.write_text(f"{ADDRESS_MARK} 203.0.113.7:6379 203.0.113.7:10001\n")  # another machine's head
    assert _head_address(output) == "ray://203.0.113.7:10001"
    output.write_text(f"{ADDRESS_MARK} 203.0.113.7:63")  # a line still being written
    assert _head_address(output) is None


def test_lines_written_by_several_threads_stay_whole_lines() -> None:
    # the head's announcement and each joining node's echo come from threads of their own
    code = (
        "import threading\nfrom nbscale.pool.backends.slurm_allocation import _say\n"
        "def say(word):\n    for _ in range(2000):\n        _say(word * 20)\n"
        "threads = [threading.Thread(target=say, args=(w,)) for w in 'ab']\n"
        "[t.start() for t in threads]\n[t.join() for t in threads]\n"
    )
    written = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = written.splitlines()
    assert len(lines) == 4000 and set(lines) == {"a" * 20, "b" * 20}
