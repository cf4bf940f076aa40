"""`%%batch` and `%jobs` in real kernels: jobs outlive the kernel that submitted them."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from tests.kernel_session import KernelSession

pytestmark = pytest.mark.slow


def submitted_id(text: str) -> int:
    match = re.search(r"Job (\d+)", text)
    assert match, text
    return int(match.group(1))


def test_job_result_is_collected_in_a_new_kernel_after_the_first_shut_down(tmp_path: Path) -> None:
    flag = tmp_path / "go"  # the job waits for it, so it is surely still running when the kernel goes
    first = KernelSession()
    try:
        first.run("%load_ext nbscale")
        first.run(f"import math\nbase = 21\nflag = {str(flag)!r}")
        cell = first.run(
            "%%batch --name restart\nimport os, time\nwhile not os.path.exists(flag):\n    time.sleep(0.05)\n"
            "answer = base * 2\nroot = math.sqrt(answer + 7)\nprint('done', answer)"
        )
        assert cell.ok, cell.text
        job_id = submitted_id(cell.stdout)
        assert f"nbscale.jobs.get({job_id})" in cell.stdout and "answer" in cell.stdout
    finally:
        first.shutdown()  # kills the kernel's process group; the job has its own session
    assert jobs.get(job_id).state in ("queued", "running")
    flag.touch()
    second = KernelSession()
    try:
        second.run("%load_ext nbscale")
        cell = second.run(
            f"import nbscale\njob = nbscale.jobs.get({job_id})\nprint(job.wait(60), job.state)\n"
            "print(job.result('answer'), job.result('root'))\nprint(job.log())"
        )
        assert cell.ok, cell.text
        assert "True finished" in cell.stdout
        assert "42 7.0" in cell.stdout
        assert "done 42" in cell.stdout
        table = second.run("%jobs")
        assert table.ok, table.text
        [display] = table.displays
        assert "restart" in display["text/plain"] and "finished" in display["text/plain"]
        assert "<table>" in display["text/html"]
    finally:
        second.shutdown()


def test_batch_with_an_unpicklable_variable_shows_the_error_naming_it(kernel: KernelSession) -> None:
    kernel.run("import threading\nlock = threading.Lock()")
    cell = kernel.run("%%batch\nwith lock:\n    x = 1")
    assert cell.error_name == "JobError"
    assert "'lock'" in (cell.error_value or "")
    assert "Traceback" not in cell.text  # the message, not internals


def test_jobs_shows_its_table_wherever_it_stands_in_a_cell(kernel: KernelSession) -> None:
    cell = kernel.run("%jobs\njob_count = 0")  # not the cell's last line: a value would not show
    assert cell.ok, cell.text
    [display] = cell.displays
    assert "No jobs" in display["text/plain"]
    assert kernel.run("x = %jobs\nprint(x)").stdout.strip() == "None"  # displayed, not returned, as %pool and %gpu


def test_batch_help_and_jobs_with_no_jobs(kernel: KernelSession) -> None:
    table = kernel.run("%jobs")
    assert "No jobs" in table.displays[0]["text/plain"]
    help_text = kernel.run("print(get_ipython().find_cell_magic('batch').__doc__)").stdout
    assert "--pool N" in help_text and "--name NAME" in help_text  # what %%batch? shows


def test_failing_batch_cell_is_failed_with_its_line_in_the_log(kernel: KernelSession) -> None:
    cell = kernel.run("%%batch --name broken\nfirst = 1\nraise ValueError('bad value')")
    job_id = submitted_id(cell.stdout)
    result = kernel.run(
        f"import nbscale\njob = nbscale.jobs.get({job_id})\njob.wait(60)\nprint(job.state)\nprint(job.log())"
    )
    assert "failed" in result.stdout
    assert f'File "<batch job {job_id}>", line 2' in result.stdout
    assert "ValueError: bad value" in result.stdout


def test_cancel_from_the_kernel(kernel: KernelSession) -> None:
    cell = kernel.run("%%batch\nimport time\ntime.sleep(60)")
    job_id = submitted_id(cell.stdout)
    time.sleep(0.5)
    result = kernel.run(f"import nbscale\nprint(nbscale.jobs.cancel({job_id}), nbscale.jobs.get({job_id}).state)")
    assert "True cancelled" in result.stdout, result.text


def test_batch_sends_notebook_functions_and_keeps_env_values_out_of_the_output(kernel: KernelSession) -> None:
    kernel.run(
        "class Scale:\n    def __init__(self, k):\n        self.k = k\n\n"
        "def square(v):\n    return v * v\n\nscale = Scale(3)"
    )
    cell = kernel.run(
        "%%batch --env API_TOKEN=tok-98765 --name env\nimport os\nvalue = square(scale.k)\n"
        "token_seen = os.environ['API_TOKEN'][:3]"
    )
    assert cell.ok, cell.text
    assert "tok-98765" not in cell.text
    job_id = submitted_id(cell.stdout)
    result = kernel.run(
        f"import nbscale\njob = nbscale.jobs.get({job_id})\njob.wait(60)\n"
        "print(job.result('value'), job.result('token_seen'))"
    )
    assert "9 tok" in result.stdout, result.text
    assert "tok-98765" not in jobs.get(job_id).log()


def test_the_python_forms_of_batch_and_spmd_take_the_notebooks_variables_as_the_magics_do(
    kernel: KernelSession,
) -> None:
    """`nbscale.jobs.submit(code)` and `pool.spmd(code)` without `namespace=` read and bind the notebook's
    variables, as `%%batch` and `%%spmd` do (a user writing the Python form expects the same words to work)."""
    kernel.run("import nbscale\nbase = 20")
    cell = kernel.run(
        "job = nbscale.jobs.submit('answer = base + 1')\njob.wait(timeout=60)\nprint(job.result('answer'))"
    )
    assert cell.ok and cell.stdout.strip() == "21", cell.text
    cell = kernel.run(
        "with nbscale.Pool(2, cpu=True) as pool:\n    pool.spmd('doubled = (base + rank) * 2')\n    print(doubled[:])"
    )
    assert cell.ok and cell.stdout.strip() == "[40, 42]", cell.text
