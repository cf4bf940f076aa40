"""`%%batch --pool N`: the job opens its own pool, bound to `pool`, and closes it at the end."""

from __future__ import annotations

import re

import pytest

import nbscale.jobs as jobs
from tests.kernel_session import KernelSession

pytestmark = pytest.mark.slow


def test_batch_with_a_pool_runs_pool_run_in_the_job(kernel: KernelSession) -> None:
    kernel.run("factor = 3")
    cell = kernel.run(
        "%%batch --pool 2 --name pooled\nimport nbscale\n"
        "products = pool.run(lambda x: x * factor, 7)\nsame_pool = nbscale.current_pool() is pool\n"
        "print('ran on', pool.size)"
    )
    assert cell.ok, cell.text
    job_id = int(re.search(r"Job (\d+)", cell.stdout).group(1))  # type: ignore[union-attr]
    job = jobs.get(job_id)
    assert job.wait(240), job.log()
    assert job.state == "finished", job.log()
    assert job.result("products") == [21, 21]
    assert job.result("same_pool") is True
    assert "ran on 2" in job.log()
    assert "pool" not in job.result_names  # the pool itself is not a result


def test_composite_assigned_in_a_pool_job_is_saved_as_its_values() -> None:
    job = jobs.submit("values = pool.spmd('v = rank + 1')['v']\n", pool=2)
    assert job.wait(240), job.log()
    assert job.state == "finished", job.log()
    assert job.result("values") == [1, 2]


def test_notebook_pool_read_by_a_cell_says_to_use_the_pool_flag() -> None:
    from nbscale.errors import JobError
    from nbscale.pool.pool import Pool

    fake = Pool.__new__(Pool)  # the type is what matters: no workers are started
    with pytest.raises(JobError, match="--pool N"):
        jobs.submit("pool.run(print)\n", namespace={"pool": fake})
