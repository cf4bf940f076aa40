"""Relaying a worker's output stays bounded: an unfinished line is kept only from its last redraw ("\\r") and goes
in pieces past 64 K characters (it kept growing, copied whole on every write: 100 MB of redraws never ended)."""

from __future__ import annotations

import nbscale

MB = 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _redraw(count: int) -> int:
    for step in range(count):
        print(f"\r{step:>8} " + "#" * 1014, end="")  # 1 KiB a redraw, never a newline
    return count


def _long_line(characters: int) -> int:
    for _ in range(characters // 1024):
        print("z" * 1024, end="")
    print()
    return characters


def test_20_mb_of_redraws_show_the_last_one_and_cost_the_kernel_no_more_than_a_few_mib(capfd):
    with nbscale.Pool(1, cpu=True) as pool:
        pool.run(int)
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        before = _status("VmRSS")
        assert pool.run(_redraw, 20 * 1024) == [20 * 1024]
        assert _status("VmHWM") - before < 16 * MB
    shown = capfd.readouterr().out
    assert f"{20 * 1024 - 1:>8} " in shown and len(shown) < MB


def test_a_long_unfinished_line_arrives_whole_in_pieces(capfd):
    with nbscale.Pool(1, cpu=True) as pool:
        assert pool.run(_long_line, 4 * MB) == [4 * MB]
    shown = capfd.readouterr().out
    assert shown.count("z") == 4 * MB and shown.count("\n") == 1
