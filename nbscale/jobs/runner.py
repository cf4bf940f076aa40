"""The job process: `python -m nbscale.jobs.runner <job folder>`, started detached by `submit`.

It marks the job running, adds the job monitor's recorder to every training run (nbscale.training.run_observers),
rebuilds what the cell needs from the notebook (variables, modules), opens a pool if asked, runs the cell as
`__main__`, saves every variable the cell assigned into `results/` (each on its own, so one that does not fit on
the disk loses only itself), and writes the end state. Its stdout and stderr are the
job's log (set up by the submitter). Tracebacks show the cell's own lines (`File "<batch job 3>", line 2`), not
this module's frames. Its own lines to the log never stop it: on a full disk they are dropped.
"""

from __future__ import annotations

import builtins
import importlib
import itertools
import linecache
import logging
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from nbscale.cellvars import names_assigned
from nbscale.errors import JobError, NbscaleError
from nbscale.jobs.backends.local import start_time
from nbscale.jobs.files import write_atomic
from nbscale.jobs.records import NOT_WRITTEN
from nbscale.jobs.store import JobStore
from nbscale.jobs.training_recorder import recorded_for_job_monitor
from nbscale.notices import notices
from nbscale.training.run_observers import add_run_observer, end_open_runs

if TYPE_CHECKING:
    from typing import TextIO

_PACKAGE_FOLDER = str(Path(__file__).parent.parent) + os.sep  # nbscale's own files


class CellFailed(Exception):
    """The job cannot go on; the message is the one-line reason kept in the store (details are in the log)."""


def main(argv: list[str]) -> int:
    job_dir = Path(argv[1]).resolve()
    job_id = int(job_dir.name)
    store = JobStore(job_dir.parent)
    os.umask(0o077)  # whatever the job writes (checkpoints included) is the user's alone
    pid = os.getpid()
    if not store.mark_running(job_id, pid, start_time(pid)):  # whichever backend started it, it is a process here
        _say(f"[nbscale] job {job_id} was {store.get(job_id).state} before it started.")
        return 0
    record = store.get(job_id)
    add_run_observer(recorded_for_job_monitor)  # `%jobs show` follows each nbscale.train run of the cell
    code = (job_dir / "cell.py").read_text(encoding="utf-8")
    _say(f"[nbscale] job {job_id} started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {pid})")
    sys.path.insert(0, record.cwd)  # as in the kernel, the notebook's folder is importable
    namespace = _main_namespace()
    state, error, pool = "finished", None, None
    try:
        _load_inputs(job_dir / "inputs.pkl", namespace)
        if record.pool:
            from nbscale.pool.pool import Pool

            # a job running as a Ray job opens its pool as actors on that cluster (NBSCALE_JOB_CLUSTER=auto)
            pool = namespace["pool"] = Pool(record.pool, cluster=os.environ.get("NBSCALE_JOB_CLUSTER") or None)
        try:
            _run_cell(code, f"<batch job {job_id}>", namespace)
        finally:
            _end_open_runs()
    except CellFailed as failure:
        state, error = "failed", str(failure)
    except Exception as failure:  # the pool could not start, or an input could not be rebuilt
        _say(f"[nbscale] {type(failure).__name__}: {failure}", sys.stderr)
        state, error = "failed", f"{type(failure).__name__}: {failure}"
    saved: list[str] = []
    not_saved: dict[str, str] = {}  # the store's `unpicklable`: each variable that was not saved, and why
    try:
        gone = store.folder_gone(job_id)  # deleted by hand while the cell ran: nowhere to save, and no log to read
        if gone is not None:
            state, error = "failed", gone
        else:
            skip = {"pool"} if pool is not None else set()
            saved, not_saved, not_written = _save_results(store, job_id, code, namespace, skip)
            if not_written and state == "finished":  # the cell's own failure, if any, is the first error
                state, error = "failed", not_written
    finally:
        if pool is not None:
            pool.close()
    _flush()
    try:
        if store.mark_ended(job_id, state, error, saved, not_saved):
            _say(f"[nbscale] job {job_id} {state} {time.strftime('%Y-%m-%d %H:%M:%S')}")
    except JobError as failure:  # the store's disk is full: readers will find this process gone and say so
        _say(f"[nbscale] job {job_id} {state}, but its end could not be recorded: {failure}", sys.stderr)
        return 1
    return 0 if state == "finished" else 1


def _say(text: str, stream: TextIO | None = None) -> None:
    """One of the runner's own lines in the job's log, through the `nbscale.notices` logger (on stderr with
    `stream=sys.stderr`, else stdout); a log that cannot be written (a full disk) does not stop the job from
    saving its variables and its end state (the handler drops what it cannot write)."""
    notices.log(logging.WARNING if stream is sys.stderr else logging.INFO, text)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass


def _end_open_runs() -> None:
    """A TrainingMonitor the cell left open is closed now, so its record ends before the job's end is recorded."""
    try:
        end_open_runs()
    except Exception as failure:  # the cell's result matters more than its monitor's last read
        _say(f"[nbscale] closing the cell's TrainingMonitor failed: {type(failure).__name__}: {failure}", sys.stderr)


def _main_namespace() -> dict[str, Any]:
    """A fresh `__main__` module for the cell, so its functions and classes pickle by value as in a notebook."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module.__dict__


def _load_inputs(path: Path, namespace: dict[str, Any]) -> None:
    """Import the notebook's modules the cell uses and unpickle the variables it reads."""
    inputs = cloudpickle.loads(path.read_bytes())
    for name, module_name in inputs["modules"].items():
        try:
            namespace[name] = importlib.import_module(module_name)
        except Exception as error:
            raise CellFailed(
                f"module {module_name!r} (the notebook's {name!r}) cannot be imported in the job: {error}"
            ) from None
    for name, data in inputs["variables"].items():
        try:
            namespace[name] = cloudpickle.loads(data)
        except Exception as error:
            raise CellFailed(f"variable {name!r} from the notebook cannot be rebuilt in the job: {error}") from None


def _run_cell(code: str, filename: str, namespace: dict[str, Any]) -> None:
    """Run the cell; on an exception print its traceback (cell frames only) and raise CellFailed."""
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    compiled = compile(code, filename, "exec")
    try:
        exec(compiled, namespace)
    except SystemExit as exit_request:
        if exit_request.code not in (None, 0):
            raise CellFailed(f"the cell called sys.exit({exit_request.code!r})") from None
    except BaseException as error:
        _flush()
        frames = error.__traceback__.tb_next if error.__traceback__ else None
        if isinstance(error, NbscaleError):
            # a user error, shown as the notebook shows it: the user's frames up to the call into nbscale, then the
            # message; nbscale's own frames are noise
            user_frames = itertools.takewhile(
                lambda frame: not frame.filename.startswith(_PACKAGE_FOLDER), traceback.extract_tb(frames)
            )
            shown = (
                "Traceback (most recent call last):\n"
                + "".join(traceback.format_list(list(user_frames)))
                + f"{type(error).__name__}: {error}"
            )
            first_line = (str(error).strip().splitlines() or [""])[0]  # a WorkerError's ranks' tracebacks follow it
            summary = f"{type(error).__name__}: {first_line}"
        else:
            shown = "".join(traceback.format_exception(type(error), error, frames)).rstrip("\n")
            only = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()
            summary = only[-1] if isinstance(error, SyntaxError) else only[0]  # "Type: the message's first line"
        _say(shown, sys.stderr)  # the whole text; the store keeps one bounded line of `summary`
        raise CellFailed(summary) from None


def _save_results(
    store: JobStore, job_id: int, code: str, namespace: dict[str, Any], skip: set[str]
) -> tuple[list[str], dict[str, str], str | None]:
    """Pickle each variable the cell assigned into results/, each on its own, so that one that does not fit on the
    disk loses only itself. Returns (saved names, {not saved: reason}, the first write failure or None)."""
    saved: list[str] = []
    not_saved: dict[str, str] = {}
    first_failure: str | None = None
    for name in sorted(names_assigned(code) - skip):
        if name not in namespace or isinstance(namespace[name], types.ModuleType):
            continue
        value = _plain_value(namespace[name])
        try:
            data = cloudpickle.dumps(value)
        except Exception as error:
            not_saved[name] = f"{type(value).__name__} cannot be pickled: {error}"
            _say(f"[nbscale] result {name!r} not saved: {not_saved[name]}", sys.stderr)
            continue
        try:
            write_atomic(store.result_path(job_id, name), data)
        except OSError as error:  # a full disk, a file-size limit: its partial file is gone, the next may fit
            why = error.strerror or str(error)
            not_saved[name] = f"{NOT_WRITTEN} ({len(data):,} bytes): {why}"
            first_failure = first_failure or f"could not save {name}: {why}"
            _say(f"[nbscale] result {name!r} not saved: {not_saved[name]}", sys.stderr)
            continue
        finally:
            del data  # a large value's pickle is not held while the next is made
        saved.append(name)
    return saved, not_saved, first_failure


def _plain_value(value: object) -> object:
    """A Composite (values on the job's pool, gone when it closes) is saved as the list of its values."""
    if "nbscale.pool.composite" in sys.modules:
        from nbscale.pool.composite import Composite

        if isinstance(value, Composite):
            return value[:]
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv))
