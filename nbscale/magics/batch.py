"""`%%batch` and `%jobs`: parse the line, call nbscale.jobs."""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, magics_class
from IPython.display import display

from nbscale import jobs
from nbscale.cellvars import names_assigned
from nbscale.errors import JobError
from nbscale.magics.arguments import argument, cell_magic, env_pairs, line_magic, magic_arguments, parse_line
from nbscale.ui.jobs_table import JobsTable


@magics_class
class BatchMagics(Magics):
    """Batch jobs (MATLAB's `batch`): cells that run detached and are collected later."""

    shell: InteractiveShell  # registered with the kernel's shell (Magics allows None)

    @magic_arguments()
    @argument("--name", help="a name to tell the job apart in %%jobs")
    @argument("--pool", type=int, metavar="N", help="open a pool of N workers in the job, bound to `pool`")
    @argument(
        "--env",
        nargs="+",
        action="extend",
        metavar="KEY=VALUE",
        help="environment variables for the job (credentials); never stored or printed",
    )
    @argument(
        "--cluster",
        metavar="PROFILE_OR_ADDRESS",
        help="run the job on this cluster: a Ray job (a profile name, or the job server's http://HEAD:8265), or a "
        "SLURM batch job for a profile with backend = slurm",
    )
    @cell_magic
    def batch(self, line: str, cell: str) -> None:
        """Run the cell as a detached job that outlives this kernel; variables it reads are sent along."""
        args = parse_line(self.batch, line)
        job = jobs.submit(
            cell,
            name=args.name,
            pool=args.pool,
            namespace=self.shell.user_ns,
            env=env_pairs(args.env, JobError),
            cluster=args.cluster,
        )
        named = f" {args.name!r}" if args.name else ""
        lines = [
            f"Job {job.id}{named} submitted{f' to {args.cluster}' if args.cluster else ''}; it runs on its own, "
            "even if this kernel stops.",
            f"  job = nbscale.jobs.get({job.id})   # job.state, job.log(), job.wait(), job.cancel()",
        ]
        assigned = sorted(names_assigned(cell) - ({"pool"} if args.pool else set()))
        if assigned:
            lines.append(f"  job.result({assigned[0]!r})   # once it ends; it assigns: {', '.join(assigned)}")
        print("\n".join([*lines, "%jobs lists every job."]))

    @magic_arguments()
    @argument(
        "action",
        nargs="?",
        choices=["show", "cancel", "delete"],
        help="show: the live training plot of job ID; cancel: stop job ID; delete: remove jobs ID... (or "
        "--older-than AGE) from the store",
    )
    @argument("ids", nargs="*", metavar="ID", help="job ids, as %%jobs lists them")
    @argument("--training", type=int, metavar="N", help="which training of the job to show (default: the latest)")
    @argument("--wait", action="store_true", help="follow in this cell until the job ends")
    @argument("--older-than", metavar="AGE", help="with delete: every ended job older than AGE (7d, 12h, 30m)")
    @line_magic
    def jobs(self, line: str) -> None:
        """List the batch jobs in the store: id, name, state, started, elapsed; `%jobs show ID` shows the live
        training-progress figure of a training inside job ID (job.show()); `%jobs cancel ID` stops it;
        `%jobs delete ID [ID ...]` or `%jobs delete --older-than 7d` removes ended jobs (nbscale.jobs.delete())."""
        args = parse_line(self.jobs, line)
        if args.action is None:  # shown wherever the line stands in its cell, as %pool and %gpu show theirs
            display(JobsTable.from_jobs(jobs.list_jobs(), str(jobs.default_root())))
            return None
        if args.action == "delete":
            deleted = jobs.delete(*args.ids, older_than=args.older_than)
            print(
                f"Deleted job{'s' if len(deleted) != 1 else ''} {', '.join(map(str, deleted))}."
                if deleted
                else f"No ended job is older than {args.older_than}: nothing deleted."
            )
            return None
        if len(args.ids) != 1:
            raise JobError(f"%jobs {args.action} takes one job id: %jobs {args.action} 3 (%jobs lists the ids).")
        if args.action == "cancel":
            job = jobs.get(args.ids[0])
            print(f"Job {job.id} cancelled." if job.cancel() else f"Job {job.id} had already ended ({job.state}).")
            return None
        jobs.get(args.ids[0]).show(training=args.training, wait=args.wait)
        return None
