"""A cluster profile with `backend = "slurm"`: what nbscale asks SLURM for, each field checked in one place.

```toml
[profiles.hpc]
backend = "slurm"
partition = "gpu"                      # optional: SLURM's default partition
time = "02:00:00"                      # the allocation's time limit (optional: the partition's default)
stop_margin = 120                      # trainings stop this many seconds before it (their weights come back)
cpus_per_worker = 8                    # default 1
gpus_per_worker = 1                    # default 0
account = "myproject"                  # optional
python = "/shared/venv/bin/python"     # the Python on the nodes (default: the kernel's)
sbatch_args = ["--qos=normal"]         # optional, passed to sbatch as they are
job_folder = "/shared/nbscale-jobs"    # a folder the nodes and the notebook share
```
Every bad value is a PoolError naming the field, the profile and the fix.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platformdirs import user_data_dir

from nbscale.errors import PoolError

FIELDS = (
    "partition",
    "time",
    "cpus_per_worker",
    "gpus_per_worker",
    "account",
    "python",
    "sbatch_args",
    "job_folder",
    "env",
    "connect_timeout",
    "stop_margin",
)
# SLURM's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+-\d+$")


@dataclass(frozen=True)
class SlurmProfile:
    """The SLURM part of a profile (`name` is the profile's, for messages)."""

    name: str
    partition: str = ""
    time: str = ""
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0
    account: str = ""
    python: str = ""
    sbatch_args: tuple[str, ...] = ()
    job_folder: str = ""
    stop_margin: int = 120  # seconds before the time limit at which trainings are stopped

    @property
    def node_python(self) -> str:
        """The Python that runs on the nodes: `python`, else the kernel's own."""
        return self.python or sys.executable

    def field_error(self, field: str, problem: str, fix: str) -> PoolError:
        """One line naming the profile's field: 'Profile 'hpc' field partition: <problem>. <fix>.'"""
        return PoolError(f"Profile {self.name!r}, field {field}: {problem}. {fix}")


def slurm_profile(name: str, entry: dict[str, Any], where: str) -> SlurmProfile:
    """The SLURM fields of profile `name` (a table of the profiles file `where`), checked."""
    unknown = sorted(set(entry) - {*FIELDS, "backend"})
    if unknown:
        raise PoolError(
            f"Profile {name!r} in {where} has field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} that a "
            f"slurm profile does not use: remove {'them' if len(unknown) > 1 else 'it'} (fields: {', '.join(FIELDS)})."
        )
    return SlurmProfile(
        name=name,
        partition=_text(name, entry, "partition"),
        time=_time(name, entry),
        cpus_per_worker=_count(name, entry, "cpus_per_worker", 1, minimum=1),
        gpus_per_worker=_count(name, entry, "gpus_per_worker", 0, minimum=0),
        account=_text(name, entry, "account"),
        python=_text(name, entry, "python"),
        sbatch_args=_arguments(name, entry),
        job_folder=_text(name, entry, "job_folder"),
        stop_margin=_count(name, entry, "stop_margin", 120, minimum=0),
    )


def _text(name: str, entry: dict[str, Any], field: str) -> str:
    value = entry.get(field, "")
    if not isinstance(value, str):
        raise PoolError(f'Profile {name!r}, field {field}: must be a string such as {field} = "...", not {value!r}.')
    return value.strip()


def _time(name: str, entry: dict[str, Any]) -> str:
    value = _text(name, entry, "time")
    if value and not _TIME.match(value):
        raise PoolError(
            f"Profile {name!r}, field time: {value!r} is not a SLURM time limit. Write it as sbatch --time does, "
            'such as time = "02:00:00" (hours:minutes:seconds), "90" (minutes) or "1-12:00:00" (days-hours).'
        )
    return value


def _count(name: str, entry: dict[str, Any], field: str, default: int, minimum: int) -> int:
    value = entry.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PoolError(
            f"Profile {name!r}, field {field}: must be a whole number of at least {minimum}, such as "
            f"{field} = {max(minimum, 1)}, not {value!r}."
        )
    return int(value)


def _arguments(name: str, entry: dict[str, Any]) -> tuple[str, ...]:
    value = entry.get("sbatch_args", [])
    if not isinstance(value, list) or not all(isinstance(each, str) for each in value):
        raise PoolError(
            f'Profile {name!r}, field sbatch_args: must be a list of strings such as sbatch_args = ["--qos=normal"], '
            f"not {value!r}."
        )
    return tuple(value)


def shared_folder(profile: SlurmProfile) -> Path:
    """Where the notebook and the nodes exchange files (allocations' output, batch jobs' folders): the profile's
    job_folder, else `$NBSCALE_HOME/slurm`, else `slurm` in nbscale's data folder (the shared home, on most HPC
    systems)."""
    if profile.job_folder:
        return Path(profile.job_folder).expanduser()
    home = os.environ.get("NBSCALE_HOME")
    return (Path(home) if home else Path(user_data_dir("nbscale", appauthor=False))) / "slurm"
