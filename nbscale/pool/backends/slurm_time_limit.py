"""Stops the trainings on a SLURM pool before the allocation's time limit ends them.

A kernel thread reads the job's TimeLeft (`squeue -o %L`) every POLL_S seconds; once it is at most the profile's
`stop_margin` seconds, it asks every running training to stop at the end of its iteration, as the Stop button does,
so that the network's weights come back to the notebook before SLURM ends the job."""

from __future__ import annotations

import subprocess
import threading

from nbscale.pool.active_stops import stop_all
from nbscale.slurm_profile import SlurmProfile

POLL_S = 2.0


def seconds_left(text: str) -> float | None:
    """squeue's TimeLeft (`[D-]HH:MM:SS`, `MM:SS`, `UNLIMITED`) in seconds, None when it has none."""
    text = text.strip()
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not text or not all(part.isdigit() for part in parts) or (days and not days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def _time_left(job_id: int) -> float | None:
    try:
        result = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%L"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return seconds_left(result.stdout)


def stop_reason(profile: SlurmProfile, job_id: int) -> str:
    return (
        f"Stopped: SLURM job {job_id} reaches its time limit (field time of profile {profile.name!r}, "
        f"{profile.time or 'the partition default'}) within stop_margin = {profile.stop_margin} s. "
        "Ask for more time, and resume from the checkpoints (TrainingOptions.checkpoint_path)."
    )


class TimeLimitWatch:
    """The thread that stops the pool's trainings `profile.stop_margin` seconds before job `job_id` ends."""

    def __init__(self, profile: SlurmProfile, job_id: int) -> None:
        self.profile, self.job_id = profile, job_id
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"nbscale-slurm-time-{job_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            left = _time_left(self.job_id)
            if left is not None and left <= self.profile.stop_margin:
                stop_all(stop_reason(self.profile, self.job_id))

    def close(self) -> None:
        self._done.set()
