"""Batch jobs on a Ray cluster: the job's runner submitted as a Ray job through Ray's job server.

The Ray job's entrypoint is the runner a local job uses (`python -m nbscale.jobs.runner <job folder>`, its
output appended to the job's `log.txt`), started by Ray's job supervisor on the head node. So the job folder
must be reachable there under the same path: the kernel and the head on one machine, or the job store
(`NBSCALE_HOME`) on a filesystem both mount. The same holds for the notebook's folder (the job's working
directory) and the Python that runs it (`job_python` in the profile, else this kernel's interpreter).

What the store keeps for such a job: `ray_job.json` in its folder, with the job server's address and Ray's
submission id, nothing secret. Liveness and cancel go through Ray (`get_job_status`, `stop_job`), not through
the local pid, since the runner may run on another machine. `--env` values travel in the Ray job's
`runtime_env` (never in the job store or the log); Ray itself keeps a job's runtime_env in its job table,
which anyone who can reach the cluster's dashboard can read.
"""

from __future__ import annotations

import json
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from nbscale.cluster_profiles import ClusterProfile, resolve_cluster
from nbscale.errors import JobError
from nbscale.jobs.backends.base import JobBackend, Launch, LaunchFailed
from nbscale.jobs.files import append_text, write_atomic
from nbscale.jobs.records import JobRecord

RAY_JOB_FILE = "ray_job.json"
DEFAULT_JOB_PORT = 8265  # Ray's dashboard, which serves the job API
SUBMIT_TIMEOUT_S = 30.0
AGENT_READY_WAIT_S = 90.0  # a head that has just started may answer "no agent" this long (a loaded machine)
STATUS_TIMEOUT_S = 5.0
STATUS_CACHE_S = 1.0  # Job.wait polls often; ask the job server at most this often per job
UNREACHABLE_BACKOFF_S = 10.0  # after a failed request, %jobs and the server extension do not wait on it again
LOG_TAIL_CHARS = 4000

T = TypeVar("T")


@dataclass(frozen=True)
class RayJobReference:
    """Where a job runs on Ray: the job server's address and Ray's submission id."""

    job_address: str
    submission_id: str


class RayJobBackend(JobBackend):
    """The runner as a Ray job (submit with the `cluster` it goes to; follow and cancel from its job folder)."""

    name = "ray"

    def __init__(self, cluster: str | None = None) -> None:
        self.cluster = cluster  # where launch() submits (a profile or an address); following a job needs none

    def launch(self, launch: Launch) -> None:
        assert self.cluster is not None, "backend_for(cluster) makes the Ray backend that launches"
        try:
            submit_ray_job(launch.job_dir, launch.job_id, self.cluster, launch.cwd, launch.env, launch.pool)
        except JobError as error:
            raise LaunchFailed(str(error), f"it could not be submitted to Ray: {error}") from None

    def vanished(self, record: JobRecord, job_dir: Path, launch_timeout_s: float) -> str | None:
        # it runs wherever Ray put it: Ray, not a local pid, says whether it still runs; a job waiting for the
        # cluster's resources is PENDING there for as long as it takes
        ref = reference(job_dir)
        return ended_without_state(job_dir, ref) if ref is not None else None

    def cancel(self, record: JobRecord, job_dir: Path) -> None:
        ref = reference(job_dir)
        if ref is not None:  # Ray stops its process group on whatever node runs it
            stop(ref)


def job_server_address(profile: ClusterProfile) -> str:
    """The Ray job server (dashboard) URL: the profile's job_address, an http(s) --cluster, or http://HEAD:8265."""
    if profile.job_address:
        return profile.job_address.rstrip("/")
    address = profile.address
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host = "127.0.0.1" if address == "auto" else address.removeprefix("ray://").rpartition(":")[0]
    return f"http://{host}:{DEFAULT_JOB_PORT}"


def _with_timeout(action: Callable[[], T], timeout: float, what: str) -> T:
    """Run a job-server request in a thread: Ray's client has no timeout, and an unreachable host could hang."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = action()
        except Exception as error:  # handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=call, name="nbscale-ray-job-request", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} got no answer within {timeout:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return cast(T, outcome["value"])


_clients: dict[str, Any] = {}


def _client(job_address: str, timeout: float) -> Any:
    if job_address not in _clients:
        from ray.job_submission import JobSubmissionClient

        _clients[job_address] = _with_timeout(
            lambda: JobSubmissionClient(job_address), timeout, f"The Ray job server at {job_address}"
        )
    return _clients[job_address]


def submit_ray_job(
    job_dir: Path, job_id: int, cluster: str, cwd: str, env: dict[str, str], pool: int | None
) -> RayJobReference:
    """Submit the runner for `job_dir` as a Ray job on `cluster` (a profile or an address).

    A pool the job opens (`--pool N`) is made of Ray actors on the same cluster. Raises JobError when the
    cluster's job server cannot be reached within 30 s or refuses the job.
    """
    try:
        profile = resolve_cluster(cluster)
    except Exception as error:
        raise JobError(str(error)) from None
    job_address = job_server_address(profile)
    python = profile.job_python or sys.executable
    log = job_dir / "log.txt"
    entrypoint = (
        f"cd {shlex.quote(cwd)} && exec {shlex.quote(python)} -m nbscale.jobs.runner {shlex.quote(str(job_dir))}"
        f" >> {shlex.quote(str(log))} 2>&1"
    )
    env_vars = {
        **profile.env,
        **env,
        "MPLBACKEND": "Agg",
        "NBSCALE_JOB_DIR": str(job_dir),
        "PYTHONUNBUFFERED": "1",
        "NBSCALE_JOB_CLUSTER": "auto" if pool else "",  # the job's pool: actors on the cluster it runs on
    }
    runtime_env = {**profile.runtime_env, "env_vars": {**profile.runtime_env.get("env_vars", {}), **env_vars}}
    reference = RayJobReference(job_address, f"nbscale-{job_id}-{secrets.token_hex(4)}")
    # written before the submission, so a kernel that dies right after it still knows where the job went
    write_atomic(job_dir / RAY_JOB_FILE, json.dumps(reference.__dict__).encode())
    try:
        client = _client(job_address, SUBMIT_TIMEOUT_S)
        _with_timeout(
            lambda: _once_an_agent_is_ready(
                lambda: client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=reference.submission_id,
                    runtime_env=runtime_env,
                    metadata={"nbscale_job": str(job_id)},
                ),
                AGENT_READY_WAIT_S,
            ),
            SUBMIT_TIMEOUT_S + AGENT_READY_WAIT_S,
            f"Submitting to the Ray job server at {job_address}",
        )
    except Exception as error:
        (job_dir / RAY_JOB_FILE).unlink(missing_ok=True)
        raise JobError(
            f"Could not submit the job to the Ray cluster's job server at {job_address}: {error}. Check that the "
            "cluster's head runs with its dashboard (ray start --head --include-dashboard=true) and that this "
            'machine reaches it; a profile sets the URL with job_address = "http://HEAD:8265".'
        ) from None
    append_text(log, f"[nbscale] submitted to Ray at {job_address} as {reference.submission_id}\n")
    return reference


def _once_an_agent_is_ready(submit: Callable[[], Any], wait_s: float) -> Any:
    """`submit()`, asked again while the job server answers that no agent is ready yet (a head that has just
    started: Ray says to try again later), for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return submit()
        except RuntimeError as error:
            if "No available agent" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def reference(job_dir: Path) -> RayJobReference | None:
    """The Ray job behind the job in `job_dir`, or None for a local job."""
    try:
        fields = json.loads((job_dir / RAY_JOB_FILE).read_text())
    except FileNotFoundError:
        return None
    return RayJobReference(str(fields["job_address"]), str(fields["submission_id"]))


_status_cache: dict[str, tuple[float, str | None, str]] = {}
_unreachable_until: dict[str, float] = {}


def _status(ref: RayJobReference) -> tuple[str | None, str]:
    """(Ray's status name, its message); status None when the job server cannot be asked now."""
    cached = _status_cache.get(ref.submission_id)
    if cached is not None and time.monotonic() - cached[0] < STATUS_CACHE_S:
        return cached[1], cached[2]
    if time.monotonic() < _unreachable_until.get(ref.job_address, 0.0):
        return None, ""
    try:
        client = _client(ref.job_address, STATUS_TIMEOUT_S)
        info = _with_timeout(lambda: client.get_job_info(ref.submission_id), STATUS_TIMEOUT_S, "Ray's job status")
        status, message = str(info.status.value), info.message or ""
    except Exception:  # an unreachable cluster says nothing about the job: it may still run
        status, message = None, ""
        _unreachable_until[ref.job_address] = time.monotonic() + UNREACHABLE_BACKOFF_S
    _status_cache[ref.submission_id] = (time.monotonic(), status, message)
    return status, message


def ended_without_state(job_dir: Path, ref: RayJobReference) -> str | None:
    """If Ray says the job ended although the store still has it active: why (Ray's log tail goes to the log).

    None while the Ray job is pending or running, and when the job server cannot be reached.
    """
    status, message = _status(ref)
    if status is None or status in ("PENDING", "RUNNING"):
        return None
    try:
        client = _client(ref.job_address, STATUS_TIMEOUT_S)
        logs = _with_timeout(lambda: client.get_job_logs(ref.submission_id), STATUS_TIMEOUT_S, "Ray's job log")
    except Exception:  # the reason below is enough without it
        logs = ""
    if logs.strip():
        append_text(job_dir / "log.txt", f"\n[nbscale] Ray's log of {ref.submission_id}:\n{logs[-LOG_TAIL_CHARS:]}")
    first_line = (message.strip().splitlines() or ["no message"])[0].rstrip(",:")
    return f"the Ray job ended ({status}: {first_line}) before the cell ended; see the log"


def stop(ref: RayJobReference) -> None:
    """Ask Ray to stop the job (SIGTERM to its process group, then SIGKILL); errors are ignored."""
    try:
        client = _client(ref.job_address, STATUS_TIMEOUT_S)
        _with_timeout(lambda: client.stop_job(ref.submission_id), STATUS_TIMEOUT_S, "Stopping the Ray job")
    except Exception:  # the store already says cancelled; an unreachable cluster cannot be helped
        pass
    _status_cache.pop(ref.submission_id, None)
