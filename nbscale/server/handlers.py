"""REST endpoints under `/nbscale/api/` for the JupyterLab panel; each an authenticated APIHandler returning JSON.

- `GET  gpus`              `{"gpus": [...], "message": str | None}`; NVML and the machine-wide GPU registry are
                           read at most once a second. Each GPU's `holders` (user, pid, purpose "pool" or
                           "training", notebook, kernel_id, since) are the processes, any user's, that reserved
                           it (nbscale.gpu_reservations); `mine` says whether the server's user holds it.
- `GET  pools`             `{"pools": [...]}`: the state every running pool publishes (`nbscale.pool.registry`).
- `GET  jobs`              `{"jobs": [...], "available": bool}`: the batch-job store, where nbscale.jobs exists; a
                           running job's `training` (epoch, iteration, loss, time left) comes from the data-only
                           events file its training records (nbscale.jobs.training_record), never a pickle.
- `GET  jobs/<id>/log`     `{"id": int, "log": str, "truncated": bool}`: the end of a job's log.
- `POST jobs/<id>/cancel`  `{"id": int, "cancelled": bool}`.

Jupyter's token or cookie auth applies to every handler (403 without it), and XSRF to the POST. Every answer is
strict JSON (`json_text`): a number that is not finite, which a pool may publish (an idle timeout of inf), is
sent as null, since one `Infinity` would make the browser's JSON.parse fail for every notebook's panel. A
pools or jobs list that cannot be read is answered as an empty list with an `error` (the panel's other parts
keep working); an unknown job id is a 404 with a JSON message.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

if TYPE_CHECKING:
    from nbscale.jobs.job import Job

GPU_MAX_AGE_S = 1.0
LOG_TAIL_CHARS = 200_000


def json_text(value: object) -> str:
    """Strict JSON (RFC 8259) of `value`: non-finite floats become null, anything else unknown its str()."""
    return json.dumps(_finite(value), allow_nan=False, default=str)


def _finite(value: object) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


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

    return mark_own_holders(gpus().to_dict(), os.geteuid())


def mark_own_holders(answer: dict[str, Any], uid: int) -> dict[str, Any]:
    """`answer` with `mine` on each GPU holder: whether the reservation is the server's user's (its file's owner,
    which no other user can fake). Only those can be "this notebook" in the panel: another user's reservation may
    name any pid or kernel id."""
    for gpu in answer.get("gpus", []):
        for holder in gpu.get("holders", []):
            holder["mine"] = holder.get("uid") == uid
    return answer


def jobs_module() -> ModuleType | None:
    """nbscale.jobs where it is installed and offers `list_jobs()`; None otherwise (the panel shows no jobs)."""
    try:
        import nbscale.jobs as jobs
    except Exception:  # not written yet, or broken: the rest of the panel still works
        return None
    return jobs if callable(getattr(jobs, "list_jobs", None)) else None


class NotFound(tornado.web.HTTPError):
    """A 404 whose JSON message is `message` as written (tornado doubles each % of an HTTPError's message)."""

    def __init__(self, message: str) -> None:
        super().__init__(404)
        self.message = message


class NbscaleHandler(APIHandler):
    """An APIHandler whose NotFound errors answer their message unchanged."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None))[1]
        if isinstance(error, NotFound):
            self.set_header("Content-Type", "application/json")
            self.finish(json_text({"message": error.message, "reason": None}))
            return
        super().write_error(status_code, **kwargs)


class GpusHandler(NbscaleHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        cache: GpuCache = self.settings["nbscale_gpu_cache"]
        self.finish(json_text(await cache.get()))


class PoolsHandler(NbscaleHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        from nbscale.pool import registry

        try:
            pools = await asyncio.to_thread(registry.read_all)  # also removes the files of dead or silent pools
        except Exception as error:  # a file no pool wrote: the rest of the panel keeps working
            self.log.warning("nbscale: cannot read the pool registry: %s", error)
            self.finish(json_text({"pools": [], "error": f"The pool registry cannot be read: {error}"}))
            return
        self.finish(json_text({"pools": pools}))


class JobsHandler(NbscaleHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        from nbscale.errors import NbscaleError

        jobs = jobs_module()
        try:
            listed = await asyncio.to_thread(jobs.list_jobs) if jobs else []
        except NbscaleError as error:  # a damaged job store: its message says what and how to recover
            self.finish(json_text({"jobs": [], "available": True, "error": str(error)}))
            return
        self.finish(json_text({"jobs": listed, "available": jobs is not None}))


class JobLogHandler(NbscaleHandler):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        jobs, number = _jobs_offering("get"), _job_number(job_id)
        text = await asyncio.to_thread(lambda: _call_job(lambda: _log_end(jobs.get(number))))
        truncated = len(text) > LOG_TAIL_CHARS
        self.finish(json_text({"id": number, "log": text[-LOG_TAIL_CHARS:], "truncated": truncated}))


class JobCancelHandler(NbscaleHandler):
    @tornado.web.authenticated
    async def post(self, job_id: str) -> None:
        jobs, number = _jobs_offering("cancel"), _job_number(job_id)
        cancelled = await asyncio.to_thread(lambda: _call_job(lambda: jobs.cancel(number)))
        self.finish(json_text({"id": number, "cancelled": bool(cancelled)}))


class UnknownEndpointHandler(NbscaleHandler):
    """Any other path under /nbscale/api/: a JSON 404 listing the endpoints (not Jupyter's HTML page)."""

    @tornado.web.authenticated
    def get(self, path: str) -> None:
        shown = path if len(path) <= 60 else f"{path[:57]}..."
        raise NotFound(
            f"nbscale's server extension has no endpoint {shown!r}: it serves gpus, pools, jobs, "
            "jobs/<id>/log and jobs/<id>/cancel (ids are job numbers)."
        )

    post = put = patch = delete = get


def _jobs_offering(function: str) -> Any:
    jobs = jobs_module()
    if jobs is None or not callable(getattr(jobs, function, None)):
        raise NotFound(f"nbscale.jobs offers no {function}() here.")
    return jobs


def _log_end(job: Job) -> str:
    """The last LOG_TAIL_CHARS + 1 characters (one more tells that it was cut), as job.log(tail=...) reads them: from
    a bounded window at the end of the file, since a runaway job's log (a progress bar redrawn with '\r' and no
    newline) may be gigabytes."""
    return job.log(tail=LOG_TAIL_CHARS + 1)


def _job_number(text: str) -> int:
    """The id in the URL (digits, by the route); 404 past any id a job store gives (SQLite's 64-bit INTEGER)."""
    number = int(text) if len(text) <= 20 else None  # int() of 4300+ digits would raise, and no id is that long
    if number is None or not 1 <= number < 2**63:
        shown = text if len(text) <= 24 else f"{text[:21]}..."
        raise NotFound(f"There is no job {shown}: job ids are the numbers %jobs shows.")
    return number


def _call_job(action: Callable[[], Any]) -> Any:
    from nbscale.errors import JobError

    try:
        return action()
    except JobError as error:  # no such job: its message says so
        raise NotFound(str(error)) from None


def setup_handlers(web_app: tornado.web.Application) -> None:
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
            (url_path_join(base, r"(.*)"), UnknownEndpointHandler),  # last: only what nothing above matched
        ],
    )
