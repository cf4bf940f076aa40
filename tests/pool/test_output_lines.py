"""How workers' printed pieces become the notebook's lines, whichever order the ranks' pieces arrive in."""

from __future__ import annotations

import pytest

from nbscale.pool import protocol as p
from nbscale.pool.output import end_open_lines, print_output


@pytest.fixture(autouse=True)
def _fresh_lines(capsys):
    end_open_lines()  # no line left open by another test
    capsys.readouterr()


def _pieces(*pieces: tuple[int, str]) -> None:
    for rank, text in pieces:
        print_output(p.Output(rank, "stdout", text))


@pytest.mark.parametrize("first_to_end", [0, 1])
def test_a_line_every_rank_prints_in_pieces_is_one_line_per_rank_whichever_rank_ends_first(capsys, first_to_end):
    last_to_end = 1 - first_to_end
    _pieces((1, "loading"), (0, "loading"), (first_to_end, " ok\n"), (last_to_end, " ok\n"))
    end_open_lines()
    assert sorted(capsys.readouterr().out.splitlines()) == ["[0] loading ok", "[1] loading ok"]


def test_a_progress_bar_left_open_does_not_hold_back_other_ranks_lines(capsys):
    _pieces((0, "\r 10%"), (1, "epoch 1 done\n"))
    assert "[1] epoch 1 done" in capsys.readouterr().out  # shown at once, not when the bar ends
    end_open_lines()
