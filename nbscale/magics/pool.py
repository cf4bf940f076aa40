"""`%pool` and `%%spmd`: parse the line, call nbscale.Pool."""

from __future__ import annotations

import inspect

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, magics_class
from IPython.display import display

from nbscale.errors import PoolError
from nbscale.gpu import gpus
from nbscale.magics.arguments import (
    argument,
    cell_magic,
    env_pairs,
    int_list,
    line_magic,
    magic_arguments,
    parse_line,
)
from nbscale.pool.pool import Pool, current_pool, open_pool, reopens_idle_pool, take_shutdown_notice
from nbscale.ui.gpu_table import pool_gpus_note

_ACTIONS = ("start", "status", "stop", "restart")


def _minutes(text: str) -> float:
    """--idle-timeout's value as a number; PoolSettings says which numbers are allowed."""
    try:
        return float(text)
    except ValueError:
        raise PoolError(f"--idle-timeout {text}: give minutes as a number, such as 30 (0 = never).") from None


def _seconds(text: str) -> float:
    """--connect-timeout's value as a number; PoolSettings says which numbers are allowed."""
    try:
        return float(text)
    except ValueError:
        raise PoolError(f"--connect-timeout {text}: give seconds as a number, such as 120.") from None


@magics_class
class PoolMagics(Magics):
    """The worker pool (parpool) and spmd cells."""

    shell: InteractiveShell  # registered with the kernel's shell (Magics allows None)

    @magic_arguments()
    @argument("action", nargs="?", default="status", help="start | status | stop | restart (default: status)")
    @argument("n", nargs="?", type=int,
              help="number of workers (default: one per free GPU, else the CPU count, at most 4)")
    @argument("--gpus", type=int_list, help="GPU indices to use, one worker each, e.g. 0,2")
    @argument("--cpu", action="store_true", help="use CPU workers even where GPUs exist")
    @argument("--force", action="store_true", help="take GPUs another notebook holds too, sharing them")
    @argument("--cluster", help="a profile name from ~/.config/nbscale/profiles.toml, or ray://HOST:PORT")
    @argument("--idle-timeout", type=_minutes, default=30, help="minutes idle before the pool stops itself (0: never)")
    @argument("--env", nargs="+", action="extend", metavar="KEY=VALUE", help="environment variables for every worker")
    @argument("--connect-timeout", type=_seconds, metavar="SECONDS",
              help="with --cluster: seconds to reach the cluster and start its actors (default: the profile's, else 120)")
    @line_magic
    def pool(self, line: str) -> None:
        """Start, show, stop or restart the worker pool."""
        args = parse_line(self.pool, line)
        if args.action not in _ACTIONS:
            raise PoolError(f"Unknown %pool action {args.action!r}: use one of {', '.join(_ACTIONS)}.")
        if args.action != "start" and (args.n is not None or args.gpus is not None or args.cpu or args.cluster
                                       or args.env or args.force or args.connect_timeout is not None):
            raise PoolError(f"%pool {args.action} takes no N or flags; they belong to %pool start.")
        running = current_pool()
        if args.action == "start":
            pool = Pool(
                args.n, gpus=args.gpus, cpu=args.cpu, cluster=args.cluster,
                idle_timeout=args.idle_timeout, env=env_pairs(args.env), force=args.force,
                connect_timeout=args.connect_timeout,
            )
            # which GPUs it took, and who holds the others (this machine's GPUs: not for a cluster pool)
            note = pool_gpus_note(gpus()) if pool.kind == "gpu" and args.cluster is None else "."
            print(f"Started {pool.size} {pool.kind.upper()} worker{'s' if pool.size != 1 else ''} in "
                  f"{pool.start_seconds:.1f} s{note}")
            return None
        if args.action == "restart":
            if running is None and reopens_idle_pool():  # the pool the user had, as %%spmd would start it again
                print(f"{take_shutdown_notice() or 'The pool shut itself down idle.'} Starting it again with the "
                      "same settings.")
                running = open_pool()
            elif running is None:
                raise PoolError("No pool is running to restart: start one with %pool start.")
            else:
                running.restart()
            note = pool_gpus_note(gpus()) if running.kind == "gpu" and running.settings.cluster is None else "."
            workers = f"{running.size} {running.kind.upper()} worker{'s' if running.size != 1 else ''}"
            print(f"Restarted {workers} in {running.start_seconds:.1f} s{note}")
            return None
        if running is None:
            print(_no_pool_line())
            return None
        if args.action == "stop":
            running.close()
            print("Pool stopped.")
            return None
        display(running.status())  # shown wherever the line stands in its cell, not only as its last line
        return None

    @magic_arguments()
    @argument("--targets", type=int_list, help="run on these ranks only, e.g. 0,2")
    @cell_magic
    def spmd(self, line: str, cell: str) -> None:
        """Run the cell on every worker; variables it assigns become Composites here."""
        args = parse_line(self.spmd, line)
        pool = current_pool()
        if pool is None:
            notice = take_shutdown_notice()
            if reopens_idle_pool():
                print(f"{notice or 'The pool shut itself down idle.'} Starting it again with the same settings.")
            else:
                print(f"{notice + ' ' if notice else ''}No pool was running: starting one with %pool start defaults.")
            pool = open_pool()
        # the magic line stays line 1, so traceback line numbers match the cell as the notebook shows it
        code = f"# %%spmd {line}\n{cell}"
        filename = _running_cell_file(self.shell)
        pool.spmd(code, targets=args.targets, namespace=self.shell.user_ns, filename=filename)


def _running_cell_file(shell: InteractiveShell) -> str | None:
    """The file name IPython compiled the running cell into, or None (run from elsewhere).

    The workers compile the spmd cell under that name, so their tracebacks say "Cell In[7], line 4" as IPython's
    own do: IPython names a cell by that file (its execution count, which IPython 9 counts up before or after
    running the cell depending on the version, is not a reliable way to know which cell runs).
    """
    frame = inspect.currentframe()
    while frame is not None and not shell.compile.format_code_name(frame.f_code.co_filename):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else None


def _no_pool_line() -> str:
    notice = take_shutdown_notice()
    return f"{notice + ' ' if notice else ''}No pool is running. Start one with %pool start [N]."
