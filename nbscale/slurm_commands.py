"""SLURM's client commands, as nbscale uses them: `sbatch` to submit, `scontrol show job` to follow, `scancel`.

They are found on PATH and read SLURM's configuration as SLURM does (`SLURM_CONF`, else its default). A refusal
from SLURM becomes one PoolError naming the profile field to change (`partition`, `account`, `time`, ...).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from nbscale.errors import PoolError
from nbscale.slurm_profile import SlurmProfile

COMMAND_TIMEOUT_S = 30.0  # a client that cannot read its configuration retries for 60 s: fail sooner
# what sbatch says (lower case) when a field of the profile is wrong: that field, and how to fix it
_REFUSALS = (
    ("invalid partition", "partition", "Set partition to one `sinfo -s` lists, or remove it for the default one"),
    ("invalid account", "account", "Set account to one of yours (`sacctmgr show assoc user=$USER`), or remove it"),
    ("time limit", "time", "Ask for less time (the partition's limit: `sinfo -o '%P %l'`)"),
    ("invalid generic resource", "gpus_per_worker", "Set gpus_per_worker to 0 on a partition without GPUs"),
    ("gres", "gpus_per_worker", "Ask for fewer GPUs per worker, or pick a partition with GPUs"),
    (
        "node configuration is not available",
        "cpus_per_worker",
        "Ask for fewer CPUs (or GPUs) per worker or fewer workers",
    ),
    ("qos", "sbatch_args", "Fix the --qos in sbatch_args (`sacctmgr show qos`)"),
)
# pending reasons that mean the job can never start as asked: the profile field to change, and how
NEVER_STARTS = {
    "PartitionConfig": ("cpus_per_worker", "Ask for fewer CPUs (or GPUs) per worker, or fewer workers"),
    "PartitionNodeLimit": ("cpus_per_worker", "Ask for fewer workers or fewer CPUs per worker"),
    "PartitionTimeLimit": ("time", "Ask for less time (the partition's limit: `sinfo -o '%P %l'`)"),
    "InvalidAccount": ("account", "Set account to one of yours, or remove it"),
    "AccountNotAllowed": ("account", "Set account to one this partition allows, or pick another partition"),
    "InvalidQOS": ("sbatch_args", "Fix the --qos in sbatch_args (`sacctmgr show qos`)"),
    "BadConstraints": ("sbatch_args", "Fix the --constraint in sbatch_args (`sinfo -o '%N %f'`)"),
}
ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "GONE",
)


@dataclass(frozen=True)
class JobState:
    """What `scontrol show job` says of a job: its state (PENDING, RUNNING, ...; GONE once SLURM forgot it), why
    (Reason: Resources, Priority, ...) and the node it runs on."""

    state: str
    reason: str = ""
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _run(
    profile: SlurmProfile, command: list[str], stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    program = shutil.which(command[0])
    if program is None:
        raise profile.field_error(
            "backend",
            f'backend = "slurm" needs SLURM\'s {command[0]}, which is not on PATH',
            "Run the notebook on a machine of the cluster (a login node) or add SLURM's bin folder to PATH "
            "(`module load slurm`) before starting Jupyter.",
        )
    try:
        return subprocess.run(
            [program, *command[1:]], input=stdin, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise profile.field_error(
            "backend",
            f"{command[0]} did not answer within {COMMAND_TIMEOUT_S:.0f} s",
            "Check that SLURM's controller runs (`sinfo`) and that SLURM_CONF names its configuration.",
        ) from None


def submit(profile: SlurmProfile, options: list[str], script: str, env: dict[str, str] | None = None) -> int:
    """Submit `script` (a batch script's text) with sbatch `options` and the profile's, in environment `env`
    (default: this process's; sbatch hands it to the job); the job id."""
    result = _run(profile, ["sbatch", "--parsable", *profile_options(profile), *options], stdin=script, env=env)
    if result.returncode != 0:
        raise refusal(profile, result.stderr)
    return int(result.stdout.strip().split(";")[0])


def profile_options(profile: SlurmProfile) -> list[str]:
    """sbatch's options for the profile's partition, time and account, then its sbatch_args as they are."""
    options = [f"--partition={profile.partition}"] if profile.partition else []
    options += [f"--time={profile.time}"] if profile.time else []
    options += [f"--account={profile.account}"] if profile.account else []
    return options + list(profile.sbatch_args)


def refusal(profile: SlurmProfile, stderr: str) -> PoolError:
    """sbatch's refusal as one line naming the profile field it points at."""
    said = " ".join(line.removeprefix("sbatch: error: ").strip() for line in stderr.strip().splitlines())
    lowered = said.lower()
    for words, field, fix in _REFUSALS:
        if words in lowered:
            return profile.field_error(field, f"SLURM refused the allocation ({said})", fix + ".")
    return profile.field_error(
        "sbatch_args", f"SLURM refused the allocation ({said})", "Check the profile's fields and sbatch_args."
    )


def never_starts(profile: SlurmProfile, job_id: int, state: JobState) -> PoolError | None:
    """A pending job SLURM will never start as asked (its reason says so): the error naming the field; else None."""
    if state.state != "PENDING" or state.reason not in NEVER_STARTS:
        return None
    field, fix = NEVER_STARTS[state.reason]
    return profile.field_error(
        field, f"SLURM cannot ever start job {job_id} as asked (PENDING: {state.reason}); it was cancelled", fix + "."
    )


def job_state(profile: SlurmProfile, job_id: int) -> JobState:
    """The job's state now, from `scontrol show job` (GONE once SLURM no longer knows the job)."""
    result = _run(profile, ["scontrol", "show", "job", "-o", str(job_id)])
    if result.returncode != 0:
        return JobState("GONE")
    fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
    return JobState(fields.get("JobState", "GONE"), fields.get("Reason", "None"), fields.get("NodeList", ""))


def cancel(profile: SlurmProfile, job_id: int) -> None:
    """`scancel` the job (SLURM ends every process of it); a job already ended is fine."""
    _run(profile, ["scancel", str(job_id)])
