"""REST endpoints under `/nbscale/api/` for the JupyterLab panel; each an authenticated APIHandler returning JSON.

- `GET  gpus`              `{"gpus": [...], "message": str | None}`; NVML is read at most once a second.
- `GET  pools`             `{"pools": [...]}`: the state every running pool publishes (`nbscale.pool.registry`).
- `GET  jobs`              `{"jobs": [...], "available": bool}`: the batch-job store, where nbscale.jobs exists.
- `GET  jobs/<id>/log`     `{"id": int, "log": str, "truncated": bool}`: the end of a job's log.
- `POST jobs/<id>/cancel`  `{"id": int, "cancelled": bool}`.

Jupyter's token or cookie auth applies to every handler (403 without it), and XSRF to the POST.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

GPU_MAX_AGE_S = 1.0
LOG_TAIL_CHARS = 200_000


class GpuCache:
    """NVML read at most once per `max_age_s`, however many browsers poll; readers share the last answer."""

    def __init__(self, read: Callable[[], dict[str, Any]] | None = None, max_age_s: float = GPU_MAX_AGE_S) -> None:
        self._read = read or _read_gpus
        self.max_age_s = max_age_s
        self._value: dict[str, Any] | None = None
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, Any]:
        async with self._lock:
            if self._value is None or time.monotonic() - self._read_at >= self.max_age_s:
                self._value = await asyncio.to_thread(self._read)  # NVML calls block; keep the server responsive
                self._read_at = time.monotonic()
            return self._value


def _read_gpus() -> dict[str, Any]:
    from nbscale.gpu import gpus

    return gpus().to_dict()


def jobs_module() -> ModuleType | None:
    """nbscale.jobs where it is installed and offers `list_jobs()`; None otherwise (the panel shows no jobs)."""
    try:
        import nbscale.jobs as jobs
    except Exception:  # not written yet, or broken: the rest of the panel still works
        return None
    return jobs if callable(getattr(jobs, "list_jobs", None)) else None


class GpusHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        cache: GpuCache = self.settings["nbscale_gpu_cache"]
        self.finish(json.dumps(await cache.get()))


class PoolsHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        from nbscale.pool import registry

        pools = await asyncio.to_thread(registry.read_all)  # also removes the files of dead or silent pools
        self.finish(json.dumps({"pools": pools}))


class JobsHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        jobs = jobs_module()
        listed = await asyncio.to_thread(jobs.list_jobs) if jobs else []
        self.finish(json.dumps({"jobs": listed, "available": jobs is not None}))


class JobLogHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        jobs = _jobs_offering("get")
        text = await asyncio.to_thread(lambda: _call_job(lambda: jobs.get(int(job_id)).log()))
        truncated = len(text) > LOG_TAIL_CHARS
        self.finish(json.dumps({"id": int(job_id), "log": text[-LOG_TAIL_CHARS:], "truncated": truncated}))


class JobCancelHandler(APIHandler):
    @tornado.web.authenticated
    async def post(self, job_id: str) -> None:
        jobs = _jobs_offering("cancel")
        cancelled = await asyncio.to_thread(lambda: _call_job(lambda: jobs.cancel(int(job_id))))
        self.finish(json.dumps({"id": int(job_id), "cancelled": bool(cancelled)}))


def _jobs_offering(function: str) -> Any:
    jobs = jobs_module()
    if jobs is None or not callable(getattr(jobs, function, None)):
        raise tornado.web.HTTPError(404, f"nbscale.jobs offers no {function}() here.")
    return jobs


def _call_job(action: Callable[[], Any]) -> Any:
    from nbscale.errors import JobError

    try:
        return action()
    except JobError as error:  # no such job: its message says so
        raise tornado.web.HTTPError(404, str(error)) from None


def setup_handlers(web_app: Any) -> None:
    """Add the `/nbscale/api/...` routes (under the server's base_url) and the shared GPU cache."""
    base = url_path_join(web_app.settings["base_url"], "nbscale", "api")
    web_app.settings["nbscale_gpu_cache"] = GpuCache()
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "gpus"), GpusHandler),
            (url_path_join(base, "pools"), PoolsHandler),
            (url_path_join(base, "jobs"), JobsHandler),
            (url_path_join(base, r"jobs/(\d+)/log"), JobLogHandler),
            (url_path_join(base, r"jobs/(\d+)/cancel"), JobCancelHandler),
        ],
    )
