"""The jobs API with real detached processes: state, log, results, failures, cancel, death, privacy."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import Job, JobStore

WAIT_S = 60


def wait_for_log(job: Job, text: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while text not in job.log():
        assert time.monotonic() < deadline, f"{text!r} never appeared in the log:\n{job.log()}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_job_returns_assigned_variables_and_reads_notebook_variables_and_modules() -> None:
    code = "y = x * 2\nroot = math.sqrt(y)\nlabel = f'{name}!'\n"
    job = jobs.submit(code, name="double", namespace={"x": 8, "math": math, "name": "ok", "unused": object()})
    assert job.wait(WAIT_S)
    assert job.state == "finished", job.log()
    assert (job.result("y"), job.result("root"), job.result("label")) == (16, 4.0, "ok!")
    assert job.name == "double"
    assert job.result_names == ("label", "root", "y")


def test_result_of_a_name_the_cell_did_not_assign_lists_the_names_it_did() -> None:
    job = jobs.submit("alpha = 1\nbeta = alpha + 1\n")
    job.wait(WAIT_S)
    with pytest.raises(JobError, match=r"did not assign 'net'.*alpha, beta"):
        job.result("net")


def test_result_while_running_says_to_wait() -> None:
    job = jobs.submit("import time\ntime.sleep(30)\nvalue = 1\n")
    with pytest.raises(JobError, match=r"still (queued|running).*job\.wait\(\)"):
        job.result("value")
    job.cancel()


def test_log_holds_stdout_and_stderr_in_order() -> None:
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nprint('stdout again')\n"
    job = jobs.submit(code)
    job.wait(WAIT_S)
    log = job.log()
    assert log.index("to stdout") < log.index("to stderr") < log.index("stdout again")


def test_log_shows_a_redrawn_progress_line_as_a_terminal_does_and_tail_counts_the_shown_text() -> None:
    code = (
        "for percent in range(0, 101, 10):\n    print(f'\\rPreparing data {percent}%', end='', flush=True)\n"
        "print()\nfor step in range(300):\n    print(f'\\rstep {step}', end='', flush=True)\nprint(' done')\n"
    )
    job = jobs.submit(code)
    assert job.wait(WAIT_S) and job.state == "finished", job.log()
    log = job.log()
    assert "\r" not in log and "Preparing data 90%" not in log and "step 298" not in log
    assert "\nPreparing data 100%\nstep 299 done\n" in log
    assert b"\rPreparing data 90%" in job.log_path.read_bytes()  # the file keeps what the cell wrote
    for tail in (0, 1, 14, 40, 200, len(log), len(log) + 50):
        assert job.log(tail=tail) == (log[-tail:] if tail else ""), tail


@pytest.mark.slow
def test_training_errors_in_a_job_give_no_notebook_only_advice() -> None:
    code = (
        "import nbscale\nfrom tests.training.digits import digits, tiny_net\n"
        "for fields in ({'execution_environment': 'gpu'}, {'worker_load': [3, 1], 'execution_environment': 'cpu'},\n"
        "               {'execution_environment': 'multi-gpu'}):\n"
        "    try:\n"
        "        nbscale.train(tiny_net(), digits()[0], nbscale.TrainingOptions('sgdm', verbose=False, **fields))\n"
        "    except nbscale.OptionsError as error:\n        print(error)\n"
    )
    job = jobs.submit(code, pool=1, env={"CUDA_VISIBLE_DEVICES": ""})  # a job whose pool has CPU workers
    assert job.wait(WAIT_S) and job.state == "finished", job.log()
    log = job.log()
    assert "no CUDA GPU is visible to this process (torch.cuda.is_available() is False)" in log
    assert "execution_environment='cpu' trains in this process: use execution_environment='parallel'" in log
    assert "stop that pool (%pool stop, or nbscale.current_pool().close()) and train again" in log
    errors = [line for line in log.splitlines() if "execution_environment=" in line]
    assert len(errors) == 3 and not any("kernel" in line or "notebook" in line for line in errors), log


def test_failing_job_is_failed_with_a_traceback_naming_the_cell_line() -> None:
    job = jobs.submit("a = 1\nb = a + 1\nc = b / 0\n")
    job.wait(WAIT_S)
    assert job.state == "failed"
    assert job.error == "ZeroDivisionError: division by zero"
    log = job.log()
    assert f'File "<batch job {job.id}>", line 3' in log
    assert "c = b / 0" in log
    assert "runner.py" not in log  # only the cell's frames
    assert job.result("b") == 2  # what it assigned before failing is kept


def test_an_nbscale_error_in_a_job_shows_the_cell_line_and_message_not_nbscales_frames() -> None:
    code = (
        "import nbscale\ndef options():\n    return nbscale.TrainingOptions('sgdm', max_epochs=0)\nopts = options()\n"
    )
    job = jobs.submit(code)
    job.wait(WAIT_S)
    assert job.state == "failed"
    assert job.error == (
        "OptionsError: TrainingOptions.max_epochs=0 is not allowed: max_epochs must be an integer in [1, 1000000]."
    )
    log = job.log()
    assert f'File "<batch job {job.id}>", line 4' in log and f'File "<batch job {job.id}>", line 3' in log
    assert "\nOptionsError: TrainingOptions.max_epochs=0 is not allowed" in log
    assert "nbscale/" not in log and "nbscale.errors" not in log  # as in the notebook: the message, not internals


def test_stop_training_of_a_job_that_ended_without_training_is_false() -> None:
    job = jobs.submit("x = 1\n")
    job.wait(WAIT_S)
    assert job.stop_training() is False  # as for any ended job: nothing is left to stop


def test_cancel_kills_the_whole_process_group() -> None:
    code = (
        "import subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\n"
        "print('child', child.pid, flush=True)\ntime.sleep(60)\n"
    )
    job = jobs.submit(code)
    wait_for_log(job, "child ")
    child_pid = int(job.log().split("child ")[1].split()[0])
    runner_pid = job.record().pid
    assert jobs.cancel(job.id) is True
    assert job.state == "cancelled"
    deadline = time.monotonic() + 10
    while not (gone(child_pid) and gone(runner_pid)):
        assert time.monotonic() < deadline, "the job's processes survived cancel"
        time.sleep(0.05)
    assert job.cancel() is False  # already ended
    assert "cancelled" in job.log()
    with pytest.raises(JobError, match="was cancelled"):
        job.result("child")


def test_killed_job_process_is_marked_failed_with_its_log_kept() -> None:
    job = jobs.submit("import time\nprint('working', flush=True)\ntime.sleep(60)\n")
    wait_for_log(job, "working")
    os.kill(job.record().pid, signal.SIGKILL)
    assert job.wait(WAIT_S)
    assert job.state == "failed"
    assert "process died" in (job.error or "")
    assert "working" in job.log() and "process died" in job.log()


def test_unpicklable_variable_is_a_job_error_naming_it() -> None:
    with pytest.raises(JobError, match=r"Variable 'lock' \(lock\) cannot be sent to the job"):
        jobs.submit("with lock:\n    pass\n", namespace={"lock": threading.Lock()})
    assert jobs.list_jobs() == []  # nothing was submitted


def test_syntax_error_is_a_job_error_with_the_line() -> None:
    with pytest.raises(JobError, match="line 2"):
        jobs.submit("x = 1\nx = = 2\n")


def test_unpicklable_result_is_reported_by_name() -> None:
    job = jobs.submit("import threading\nlock = threading.Lock()\nfine = 3\n")
    job.wait(WAIT_S)
    assert job.state == "finished"
    assert job.result("fine") == 3
    with pytest.raises(JobError, match="assigned 'lock', but it could not be saved"):
        job.result("lock")


def test_job_folder_and_store_are_private(job_store: JobStore) -> None:
    job = jobs.submit("value = 1\nopen('written.txt', 'w').write('x')\n", cwd=str(job_store.root.parent))
    job.wait(WAIT_S)
    assert stat.S_IMODE(job_store.root.stat().st_mode) == 0o700
    for path in [job.folder, *job.folder.rglob("*"), job_store.index_path]:
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert stat.S_IMODE((job_store.root.parent / "written.txt").stat().st_mode) == 0o600  # the job's own files


def test_env_values_reach_the_job_but_never_the_store(job_store: JobStore) -> None:
    secret = "s3cr3t-token-value-1234"
    job = jobs.submit(
        "import os\nmatches = os.environ['API_TOKEN'] == expected\n",
        namespace={"expected": "x"},
        env={"API_TOKEN": secret},
    )
    job.wait(WAIT_S)
    assert job.result("matches") is False  # compared, not printed
    for path in job_store.root.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_current_job_dir_is_the_job_folder() -> None:
    job = jobs.submit("import nbscale.jobs\nfolder = str(nbscale.jobs.current_job_dir())\n")
    job.wait(WAIT_S)
    assert Path(job.result("folder")) == job.folder
    assert jobs.current_job_dir() is None  # not in a job here


def test_list_jobs_returns_plain_json_ready_dicts() -> None:
    job = jobs.submit("v = 1\n", name="listed")
    job.wait(WAIT_S)
    [listed] = jobs.list_jobs()
    assert json.loads(json.dumps(listed)) == listed
    assert {"id", "name", "state", "started", "elapsed_s", "log_path"} <= set(listed)
    assert (listed["id"], listed["name"], listed["state"]) == (job.id, "listed", "finished")
    assert Path(listed["log_path"]).read_text() == job.log()


def test_get_unknown_job_is_a_job_error() -> None:
    with pytest.raises(JobError, match="no job 999"):
        jobs.get(999)


def test_wait_with_timeout_returns_false_while_running() -> None:
    job = jobs.submit("import time\ntime.sleep(30)\n")
    assert job.wait(timeout=0.2) is False
    job.cancel()


def test_private_looking_notebook_variables_are_sent_but_ipython_history_is_not() -> None:
    namespace = {"_offset": 5, "_i3": "x = 1", "_oh": {}}
    job = jobs.submit(
        "total = _offset + 1\ntry:\n    _i3\n    seen = True\nexcept NameError:\n    seen = False\n",
        namespace=namespace,
    )
    job.wait(WAIT_S)
    assert (job.result("total"), job.result("seen")) == (6, False)
