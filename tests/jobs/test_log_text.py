"""A job's log read as a terminal shows it, with memory bounded by what is shown, not by the file's size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbscale.jobs as jobs
from nbscale.jobs import JobStore

REPO = Path(__file__).resolve().parents[2]


def _job_with_log(store: JobStore, content: bytes) -> int:
    job_id = store.create("logged", None, str(REPO))
    store.log_path(job_id).write_bytes(content)
    return job_id


def test_tail_of_every_length_is_the_end_of_the_whole_shown_log(job_store: JobStore) -> None:
    lines = []
    for number in range(20000):  # multibyte characters, '\r' redraws, '\r\n' endings, a bar cut mid-line
        if number % 7 == 0:
            lines.append("".join(f"\rétape {step} €" for step in range(number % 50)) + "\r\n")
        else:
            lines.append(f"line {number} ünïcode {'x' * (number % 90)}\n")
    content = ("".join(lines) + "\rbar 1\rbar 2 ✓").encode("utf-8")
    job = jobs.get(_job_with_log(job_store, content))
    whole = job.log()
    assert whole.endswith("\nbar 2 ✓") and "\r" not in whole and "étape 48 €\n" in whole
    for tail in (1, 2, 7, 100, 4097, 65536, 300_001, len(whole) - 1, len(whole), len(whole) + 10):
        assert job.log(tail=tail) == whole[-tail:], tail


def test_a_100_mb_progress_bar_without_a_newline_is_read_in_bounded_memory(job_store: JobStore, tmp_path: Path) -> None:
    """Measured in a fresh process by its peak resident memory (ru_maxrss): a log of 100 MB of '\\r' redraws, as
    tqdm leaves it, read with the tail the panel's log endpoint asks for, whole, and with a tail longer than it."""
    script = """
import json, resource, sys
import nbscale.jobs as jobs
store = jobs.JobStore()
job_id = store.create("bar", None, sys.argv[1])
chunk = b"".join(b"\\rtraining %9d/9999999 |#####     |" % step for step in range(30000))
with open(store.log_path(job_id), "wb") as log:
    log.write(b"[nbscale] job started\\n")
    while log.tell() < 100 * 2**20:
        log.write(chunk)
    log.write(b"\\rtraining done")
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
job = jobs.get(job_id)
before = peak()
tail = job.log(tail=200_001)
after_tail = peak()
whole = job.log()
after_whole = peak()
everything = job.log(tail=10**9)
after_everything = peak()
print(json.dumps({"tail": tail, "whole": whole, "everything": everything, "size": store.log_path(job_id).stat().st_size,
                  "tail_bytes": after_tail - before, "whole_bytes": after_whole - before,
                  "everything_bytes": after_everything - before}))
"""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=environment, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["size"] > 100 * 2**20
    assert found["tail"] == "training done"
    assert found["whole"] == found["everything"] == "[nbscale] job started\ntraining done"
    assert found["tail_bytes"] < 50 * 2**20, found["tail_bytes"]
    assert found["whole_bytes"] < 50 * 2**20, found["whole_bytes"]
    assert found["everything_bytes"] < 50 * 2**20, found["everything_bytes"]
