"""Submitting a cell as a batch job: check it, pickle what it reads from the notebook, start its runner through
the backend that runs it (nbscale.jobs.backends: this machine, or a Ray cluster)."""

from __future__ import annotations

import os
import re
import sys
import time
import types
from collections.abc import Mapping
from typing import Any, cast

import cloudpickle

from nbscale.cellvars import IPYTHON_NAMES, names_read
from nbscale.cluster_profiles import resolve_cluster
from nbscale.errors import JobError
from nbscale.jobs import arguments
from nbscale.jobs.backends import Launch, LaunchFailed, backend_for
from nbscale.jobs.files import append_text, write_atomic
from nbscale.jobs.job import Job
from nbscale.jobs.store import JobStore

# IPython's bookkeeping names (history: _i, _ii, _i3, _3, _oh, ...): never sent
_IPYTHON_HISTORY = re.compile(r"_(i+|i\d+|\d+|oh|ih|dh)")


def submit(
    code: str,
    name: str | None = None,
    pool: int | None = None,
    namespace: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    store: JobStore | None = None,
    cluster: str | None = None,
) -> Job:
    """Run `code` as a detached job (MATLAB's `batch`) and return its Job at once.

    Variables of `namespace` (default: the caller's globals, the notebook's in a notebook, as `%%batch` sends)
    that the code reads before assigning are pickled into the job;
    modules among them are imported there. With `pool=N` the job opens `nbscale.Pool(N)` as `pool` first and
    closes it at the end. `cwd` (default: this process's) is where the job runs. `env` values are set in the
    job's environment only, never written to the store or the log. `cluster` (a profile name or an address)
    runs it as a Ray job on that cluster instead of a local process; `nbscale.jobs.backends.cluster` says what
    the cluster must share with this machine. Raises JobError for an argument of the wrong kind, a syntax
    error, a variable that cannot be pickled, or a job that cannot start.
    """
    arguments.submission(code, name, namespace, cwd, env, cluster)
    try:
        compile(code, "<batch cell>", "exec")
    except SyntaxError as error:
        raise JobError(
            f"The batch cell has a syntax error on line {error.lineno}: {error.msg}. A job runs plain Python "
            "(no %magics or !commands); fix the line and submit again."
        ) from None
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 1):
        raise JobError(f"--pool takes a number of workers >= 1, not {pool!r}.")
    environment = _checked_env(env)
    if cluster is not None:  # a profile name with a typo is an error here, not a failed job in %jobs
        try:
            resolve_cluster(cluster)
        except Exception as error:  # resolve_cluster's errors name the profile file and the fix
            raise JobError(str(error)) from None
    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    inputs = _inputs(code, namespace, pool_bound=pool is not None)
    store = store or JobStore()
    directory = os.fspath(cwd) if cwd is not None else os.getcwd()
    job_id = store.create(name, pool, directory)
    launch = Launch(job_id, store.job_dir(job_id), store.log_path(job_id), directory, environment, pool)
    try:
        runner = _start(launch, code, inputs, _header(job_id, name, pool, directory), cluster)
    except LaunchFailed as failure:
        store.fail(job_id, failure.reason)
        raise JobError(str(failure)) from None
    except OSError as error:  # its folder could not be written (a full disk, say)
        store.fail(job_id, f"its folder could not be written: {error}")
        raise JobError(
            f"Job {job_id} could not be written to its folder {launch.job_dir} ({error}). Free space there or fix "
            "the folder's permissions (docs/jobs.md says where the job store lives) and submit again."
        ) from None
    except BaseException:  # interrupted while written or started: the job is failed, never left queued
        store.fail(job_id, "its submission was interrupted before the job started; submit it again")
        raise
    if runner is not None:  # a process on this machine: the store follows it by pid
        store.set_process(job_id, *runner)
    return Job(job_id, store)


def _start(
    launch: Launch, code: str, inputs: bytes, header: str, cluster: str | None
) -> tuple[int, float | None] | None:
    """Write the job's folder (code, inputs, the log's first line) and start it; its runner's pid where local."""
    write_atomic(launch.job_dir / "cell.py", code.encode("utf-8"))
    write_atomic(launch.job_dir / "inputs.pkl", inputs)
    append_text(launch.log, header)
    return backend_for(cluster).launch(launch)


def _header(job_id: int, name: str | None, pool: int | None, cwd: str) -> str:
    """The log's first line: what and where, never environment values."""
    named = f" {name!r}" if name else ""
    pooled = f", pool of {pool}" if pool else ""
    return f"[nbscale] job {job_id}{named} submitted {time.strftime('%Y-%m-%d %H:%M:%S')} in {cwd}{pooled}\n"


def _checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    checked: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise JobError(f"--env takes KEY=VALUE pairs with string values; {key!r} is not one.")
        checked[key] = value
    return checked


def _inputs(code: str, namespace: Mapping[str, Any], pool_bound: bool) -> bytes:
    """Pickle the notebook variables the cell reads before assigning (modules by name)."""
    wanted = names_read(code) - IPYTHON_NAMES - ({"pool"} if pool_bound else set())
    modules: dict[str, str] = {}
    variables: dict[str, bytes] = {}
    for name in sorted(wanted):
        if name not in namespace or _IPYTHON_HISTORY.fullmatch(name):
            continue  # not defined in the notebook: the cell will say so when it runs, as Python would
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        variables[name] = _pickle_variable(name, value)
    return cast(bytes, cloudpickle.dumps({"modules": modules, "variables": variables}))


def _pickle_variable(name: str, value: object) -> bytes:
    if type(value).__name__ == "Composite" and type(value).__module__ == "nbscale.pool.composite":
        raise JobError(
            f"Variable {name!r} is a Composite: its values live on the pool's workers, which the job cannot "
            f"reach. Bring them into the notebook first ({name} = {name}[:]) and submit again."
        )
    if type(value).__name__ == "Pool" and type(value).__module__ == "nbscale.pool.pool":
        raise JobError(
            f"Variable {name!r} is the notebook's pool: its workers belong to this kernel, not to the job. "
            "Give the job a pool of its own with %%batch --pool N (submit(..., pool=N)); it is bound to `pool`."
        )
    try:
        return cast(bytes, cloudpickle.dumps(value))
    except Exception as error:
        raise JobError(
            f"Variable {name!r} ({type(value).__name__}) cannot be sent to the job: it cannot be pickled "
            f"({error}). Create it inside the %%batch cell instead, or convert it to something picklable."
        ) from None
