"""What nbscale itself says beside the user's own output (a stalled worker, a held interrupt, a batch job's start
and end in its log): the `nbscale.notices` logger, a child of the `nbscale` logger.

Its records are shown by default, as the lines they replaced were: warnings and errors on the standard error of
the moment (a notebook cell's, a job's log), information on the standard output, each as its bare message. Quiet
them with `logging.getLogger("nbscale.notices").setLevel(logging.ERROR)`; they do not propagate to the root
logger, so a notebook's own logging setup shows each once.
"""

from __future__ import annotations

import logging
import sys

notices = logging.getLogger("nbscale.notices")


class _StandardStreams(logging.Handler):
    """Each record on the process's sys.stderr (warnings and worse) or sys.stdout as they are when it is emitted:
    IPython, a pool worker and a batch job each replace them after import."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            print(self.format(record), file=stream, flush=True)
        except OSError:  # a log that cannot be written (a full disk) must not stop what is being said
            pass


if not notices.handlers:
    notices.addHandler(_StandardStreams())
    notices.setLevel(logging.INFO)
    notices.propagate = False
