"""`%pool` and `%%spmd`: parse the line, call nbscale.Pool."""

from __future__ import annotations

import inspect
from argparse import Namespace

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, magics_class
from IPython.display import display

from nbscale.cell_names import cell_label
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
from nbscale.pool.pool import Pool, current_pool, open_pool
from nbscale.pool.session import reopens_idle_pool, take_shutdown_notice
from nbscale.pool.settings import PoolSettings
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
    @argument(
        "n", nargs="?", type=int, help="number of workers (default: one per free GPU, else the CPU count, at most 4)"
    )
    @argument("--gpus", type=int_list, help="GPU indices to use, one worker each, e.g. 0,2")
    @argument("--cpu", action="store_true", help="use CPU workers even where GPUs exist")
    @argument("--force", action="store_true", help="take GPUs another notebook holds too, sharing them")
    @argument(
        "--cluster", help="a profile name from ~/.config/nbscale/profiles.toml (Ray or SLURM), or ray://HOST:PORT"
    )
    @argument("--idle-timeout", type=_minutes, default=30, help="minutes idle before the pool stops itself (0: never)")
    @argument("--env", nargs="+", action="extend", metavar="KEY=VALUE", help="environment variables for every worker")
    @argument(
        "--connect-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="with --cluster: seconds to reach the cluster and start its actors (default: the profile's, else 120)",
    )
    @line_magic
    def pool(self, line: str) -> None:
        """Start, show, stop or restart the worker pool."""
        args = parse_line(self.pool, line)
        action = {"start": self._start, "status": self._status, "stop": self._stop, "restart": self._restart}.get(
            args.action
        )
        if action is None:
            raise PoolError(f"Unknown %pool action {args.action!r}: use one of {', '.join(_ACTIONS)}.")
        if args.action != "start" and (
            args.n is not None
            or args.gpus is not None
            or args.cpu
            or args.cluster
            or args.env
            or args.force
            or args.connect_timeout is not None
        ):
            raise PoolError(f"%pool {args.action} takes no N or flags; they belong to %pool start.")
        action(args)

    def _start(self, args: Namespace) -> None:
        pool = Pool.from_settings(
            PoolSettings(
                args.n,
                gpus=args.gpus,
                cpu=args.cpu,
                cluster=args.cluster,
                idle_timeout=args.idle_timeout,
                env=env_pairs(args.env),
                force=args.force,
                connect_timeout=args.connect_timeout,
            )
        )
        print(f"Started {_workers(pool)} in {pool.start_seconds:.1f} s{_gpus_note(pool)}")

    def _restart(self, args: Namespace) -> None:
        running = current_pool()
        if running is not None:
            running.restart()
        elif reopens_idle_pool():  # the pool the user had, as %%spmd would start it again
            running = _reopen()
        else:
            raise PoolError("No pool is running to restart: start one with %pool start.")
        print(f"Restarted {_workers(running)} in {running.start_seconds:.1f} s{_gpus_note(running)}")

    def _stop(self, args: Namespace) -> None:
        running = current_pool()
        if running is None:
            print(_no_pool_line())
            return
        running.close()
        print("Pool stopped.")

    def _status(self, args: Namespace) -> None:
        running = current_pool()
        if running is None:
            print(_no_pool_line())
            return
        display(running.status())  # shown wherever the line stands in its cell, not only as its last line

    @magic_arguments()
    @argument("--targets", type=int_list, help="run on these ranks only, e.g. 0,2")
    @cell_magic
    def spmd(self, line: str, cell: str) -> None:
        """Run the cell on every worker; variables it assigns become Composites here."""
        args = parse_line(self.spmd, line)
        pool = current_pool()
        if pool is None and reopens_idle_pool():
            pool = _reopen()
        elif pool is None:
            notice = take_shutdown_notice()
            print(f"{notice + ' ' if notice else ''}No pool was running: starting one with %pool start defaults.")
            pool = open_pool()
        # the magic line stays line 1, so traceback line numbers match the cell as the notebook shows it
        code = f"# %%spmd {line}\n{cell}"
        filename = _running_cell_file()
        pool.spmd(code, targets=args.targets, namespace=self.shell.user_ns, filename=filename)


def _running_cell_file() -> str | None:
    """The file name IPython compiled the running cell into, or None (run from elsewhere).

    The workers compile the spmd cell under that name, so their tracebacks say "Cell In[7], line 4" as IPython's
    own do: IPython names a cell by that file (its execution count, which IPython 9 counts up before or after
    running the cell depending on the version, is not a reliable way to know which cell runs).
    """
    frame = inspect.currentframe()
    while frame is not None and not cell_label(frame.f_code.co_filename):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else None


def _reopen() -> Pool:
    """Start the pool that shut itself down idle again, saying so (`%pool restart` and `%%spmd` after an idle
    stop)."""
    print(f"{take_shutdown_notice() or 'The pool shut itself down idle.'} Starting it again with the same settings.")
    return open_pool()


def _workers(pool: Pool) -> str:
    return f"{pool.size} {pool.kind.upper()} worker{'s' if pool.size != 1 else ''}"


def _gpus_note(pool: Pool) -> str:
    """Which GPUs a local GPU pool took, and who holds the others (a cluster's GPUs are not this machine's)."""
    return pool_gpus_note(gpus()) if pool.kind == "gpu" and pool.settings.cluster is None else "."


def _no_pool_line() -> str:
    notice = take_shutdown_notice()
    return f"{notice + ' ' if notice else ''}No pool is running. Start one with %pool start [N]."
