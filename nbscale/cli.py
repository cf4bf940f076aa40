"""The `nbscale` command line (also `python -m nbscale`): batch jobs, GPUs and a check of the machine, from a
terminal. It parses and calls the same Python API a notebook uses (nbscale.jobs, nbscale.gpus, nbscale.doctor).

Exit codes: 0 done; 1 an nbscale error (its message on stderr: no such job, a job still running, a damaged
store, an age that is not one), a job that was not cancelled because it had ended, or a doctor check that found
a problem; 2 a wrong command line (argparse's usage message).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from nbscale.errors import JobError, NbscaleError
from nbscale.version import installed_version

_AGE_EXAMPLES = "7d, 12h, 30m, 45s or 2w"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    args = _parser().parse_args(_age_attached(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.run(args))
    except NbscaleError as error:
        print(f"nbscale: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nbscale jobs log 3 | head`: the reader left
        sys.stderr.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbscale",
        description="nbscale from a terminal: batch jobs, GPUs, and a check of what this machine offers nbscale.",
    )
    parser.add_argument("--version", action="version", version=f"nbscale {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    jobs = commands.add_parser(
        "jobs",
        help="list, show, log, cancel and delete batch jobs (%%%%batch); alone, as 'jobs list'",
        description="The batch jobs in the job store ($NBSCALE_HOME/jobs, else the user's "
        "data folder): the same store %jobs and nbscale.jobs use. Without an action: list them.",
    )
    jobs.set_defaults(run=_jobs_list)
    actions = jobs.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="every job: id, name, state, started, elapsed").set_defaults(run=_jobs_list)
    show = actions.add_parser("show", help="one job's fields: state, times, error, saved variables, folder")
    show.add_argument("id", help="the job's id, as 'nbscale jobs list' shows it")
    show.set_defaults(run=_jobs_show)
    log = actions.add_parser("log", help="what the job printed (as a terminal shows it)")
    log.add_argument("id", help="the job's id")
    log.add_argument(
        "--tail",
        type=int,
        metavar="N",
        help="only the last N characters (read from the end of the log, however long it is)",
    )
    log.set_defaults(run=_jobs_log)
    cancel = actions.add_parser("cancel", help="stop a job and every process it started (exit 1 if it had ended)")
    cancel.add_argument("id", help="the job's id")
    cancel.set_defaults(run=_jobs_cancel)
    delete = actions.add_parser(
        "delete",
        help="remove ended jobs (record, log, saved variables, checkpoints)",
        description="Remove ended jobs from the store. A queued or running job is refused "
        "(cancel it first) and then nothing is deleted.",
    )
    delete.add_argument("ids", nargs="*", metavar="ID", help="the jobs to remove")
    delete.add_argument(
        "--older-than",
        metavar="AGE",
        help=f"instead of ids: every job that ended longer ago than AGE ({_AGE_EXAMPLES})",
    )
    delete.set_defaults(run=_jobs_delete)

    commands.add_parser("gpus", help="this machine's GPUs (NVML) and who holds them").set_defaults(run=_gpus)
    doctor = commands.add_parser(
        "doctor",
        help="check GPUs, shared memory, the job store, kernel subshells, the lab "
        "extension and Ray (exit 1 on a problem)",
    )
    doctor.add_argument(
        "--remove-stale",
        action="store_true",
        help="first remove shared-memory files killed kernels and workers left behind",
    )
    doctor.set_defaults(run=_doctor)
    return parser


def _age_attached(argv: list[str]) -> list[str]:
    """`argv` with a value of --older-than that starts with '-' attached to it (`--older-than=-1d`), so that the
    age check, not argparse ("expected one argument"), says what is wrong with it."""
    attached = list(argv)
    for index, word in enumerate(attached[:-1]):
        if word == "--older-than" and re.match(r"-\d", attached[index + 1]):
            attached[index : index + 2] = [f"--older-than={attached[index + 1]}"]
            break
    return attached


def _jobs_list(args: argparse.Namespace) -> int:
    from nbscale import jobs
    from nbscale.ui.jobs_table import JobsTable

    print(repr(JobsTable.from_jobs(jobs.list_jobs(), str(jobs.default_root()))))
    return 0


def _jobs_show(args: argparse.Namespace) -> int:
    from nbscale import jobs
    from nbscale.ui.jobs_table import format_elapsed

    job = jobs.get(args.id)
    fields: dict[str, Any] = job.as_dict()
    rows = [
        ("id", fields["id"]),
        ("name", fields["name"] or "-"),
        ("state", fields["state"]),
        ("started", fields["started"] or "-"),
        ("elapsed", format_elapsed(fields["elapsed_s"])),
        ("pool", fields["pool"] or "-"),
        ("error", fields["error"] or "-"),
        ("results", ", ".join(fields["results"]) or "-"),
        ("trainings", ", ".join(map(str, job.trainings)) or "-"),
        ("folder", job.folder),
        ("log", fields["log_path"]),
    ]
    training = fields.get("training")
    if training:
        rows.append(("training", ", ".join(f"{key} {value}" for key, value in training.items())))
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name.ljust(width)}  {value}" for name, value in rows))
    return 0


def _jobs_log(args: argparse.Namespace) -> int:
    from nbscale import jobs

    text = jobs.get(args.id).log(tail=args.tail)
    sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
    return 0


def _jobs_cancel(args: argparse.Namespace) -> int:
    from nbscale import jobs

    job = jobs.get(args.id)
    if job.cancel():
        print(f"Job {job.id} cancelled.")
        return 0
    print(f"Job {job.id} had already ended ({job.state}); nothing to cancel.")
    return 1


def _jobs_delete(args: argparse.Namespace) -> int:
    from nbscale import jobs

    if args.older_than is not None and not _is_age(args.older_than):
        unsigned = args.older_than.lstrip("-")
        raise JobError(
            f"--older-than takes an age of 0 or more ({_AGE_EXAMPLES}), not {args.older_than!r}: for example "
            f"'nbscale jobs delete --older-than {unsigned if _is_age(unsigned) else '7d'}'."
        )
    deleted = jobs.delete(*args.ids, older_than=args.older_than)
    if deleted:
        print(f"Deleted job{'s' if len(deleted) > 1 else ''} {', '.join(map(str, deleted))}.")
    else:
        print(f"No job ended more than {args.older_than} ago: nothing deleted.")
    return 0


def _is_age(value: str) -> bool:
    """Whether `value` is an age that --older-than takes."""
    from nbscale.jobs.arguments import age_s

    try:
        age_s(value)
    except JobError:
        return False
    return True


def _gpus(args: argparse.Namespace) -> int:
    from nbscale.gpu import gpus
    from nbscale.ui.gpu_table import gpu_text

    print(gpu_text(gpus()))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from nbscale.doctor import remove_stale_shared_memory, run_checks

    if args.remove_stale:
        print(remove_stale_shared_memory())
    checks = run_checks()
    width = max(len(check.name) for check in checks)
    for check in checks:
        print(f"{check.status.upper():<7}  {check.name.ljust(width)}  {check.detail}")
    return 1 if any(check.status == "problem" for check in checks) else 0
