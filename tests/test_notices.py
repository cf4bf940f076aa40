"""nbscale's own notices (nbscale.notices): shown by default on the stream of the moment, quieted by level."""

from __future__ import annotations

import logging

from nbscale.notices import notices


def test_a_warning_shows_on_stderr_and_information_on_stdout_as_bare_lines(capsys):
    notices.warning("Worker 1 has not moved")
    notices.info("Worker 0 still running a task")
    shown = capsys.readouterr()
    assert shown.err == "Worker 1 has not moved\n"
    assert shown.out == "Worker 0 still running a task\n"


def test_raising_the_level_quiets_them(capsys):
    notices.setLevel(logging.ERROR)
    try:
        notices.warning("not shown")
    finally:
        notices.setLevel(logging.INFO)
    assert capsys.readouterr().err == ""


def test_they_do_not_reach_the_root_logger_so_a_logging_setup_shows_each_once():
    # a handler of the notebook's own (pytest's caplog cannot show this: it attaches to every logger)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        notices.warning("once")
    finally:
        logging.getLogger().removeHandler(handler)
    assert seen == []
