"""The panel names a pool by its notebook or its batch job: what a real pool publishes and the server sends."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import nbscale
from nbscale.pool.owner import MAX_NAME_CHARS, pool_owner


async def _published_pools(jp_fetch) -> list[dict]:
    """The server's list, once the pool's monitor thread has published (its first beat asks the workers first)."""
    deadline = time.monotonic() + 60
    while True:
        response = await jp_fetch("nbscale", "api", "pools")
        pools = json.loads(response.body)["pools"]
        if pools or time.monotonic() > deadline:
            return pools
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_pools_notebook_and_job_reach_the_panel(jp_fetch, pool_dir, tmp_path, monkeypatch):
    job_dir = tmp_path / "jobs" / "12"
    job_dir.mkdir(parents=True)
    (job_dir / "record.json").write_text(json.dumps({"id": 12, "name": "sweep"}))
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/work/analysis.ipynb")  # as Jupyter's server sets it
    monkeypatch.setenv("NBSCALE_JOB_DIR", str(job_dir))  # as a job's backend sets it
    with nbscale.Pool(1, cpu=True):
        pools = await _published_pools(jp_fetch)
    assert [(p["notebook"], p["job_id"], p["job_name"]) for p in pools] == [
        ("/home/me/work/analysis.ipynb", 12, "sweep")
    ]


def test_outside_jupyter_and_jobs_a_pool_has_no_owner_and_a_long_path_is_cut(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv("NBSCALE_JOB_DIR", raising=False)
    assert pool_owner() == {"notebook": None, "job_id": None, "job_name": None}
    monkeypatch.setenv("JPY_SESSION_NAME", "/x" * 300 + "/deep.ipynb")
    notebook = pool_owner()["notebook"]
    assert isinstance(notebook, str) and len(notebook) == MAX_NAME_CHARS and notebook.endswith("/deep.ipynb")


def test_a_job_without_a_readable_record_is_named_by_its_id(monkeypatch, tmp_path) -> None:
    (tmp_path / "5").mkdir()
    monkeypatch.setenv("NBSCALE_JOB_DIR", str(tmp_path / "5"))
    assert (pool_owner()["job_id"], pool_owner()["job_name"]) == (5, None)
