"""Bad SLURM profiles and refusals: each is one PoolError naming the profile's field and the fix, before any worker
starts (against the real test cluster of tests/slurm_cluster.py, which starts in about a second)."""

from __future__ import annotations

import os

import pytest

import nbscale
from nbscale.cluster_profiles import resolve_cluster
from nbscale.errors import PoolError
from nbscale.pool.backends.slurm_time_limit import seconds_left
from tests.slurm_cluster import queue, running_cluster


@pytest.fixture(scope="module")
def slurm():
    """The module's SLURM cluster: the environment its clients need."""
    with running_cluster() as env:
        yield env


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """Write profile `hpc` (backend slurm) with the given extra lines; NBSCALE_PROFILES names it."""
    path = tmp_path / "profiles.toml"
    monkeypatch.setenv("NBSCALE_PROFILES", str(path))

    def write(extra: str = "") -> None:
        path.write_text(f'[profiles.hpc]\nbackend = "slurm"\njob_folder = "{tmp_path}/shared"\n{extra}')
        path.chmod(0o600)

    return write


def test_a_slurm_profiles_fields_are_read(profile):
    profile(
        'partition = "gpu"\ntime = "02:00:00"\ncpus_per_worker = 8\ngpus_per_worker = 1\naccount = "proj"\n'
        'python = "/shared/venv/bin/python"\nsbatch_args = ["--qos=normal"]\nenv = { A = "1" }\n'
    )
    found = resolve_cluster("hpc")
    assert found.backend == "slurm" and found.env == {"A": "1"} and found.gpus_per_worker == 1
    assert found.slurm is not None
    assert (found.slurm.partition, found.slurm.time, found.slurm.cpus_per_worker, found.slurm.account) == (
        "gpu",
        "02:00:00",
        8,
        "proj",
    )
    assert (found.slurm.python, found.slurm.sbatch_args) == ("/shared/venv/bin/python", ("--qos=normal",))
    assert found.slurm.stop_margin == 120  # the default: trainings stop 2 minutes before the time limit


def test_squeues_time_left_is_read_in_seconds():
    assert [seconds_left(text) for text in ("1-02:03:04", "12:30", "45", "UNLIMITED", "INVALID", "")] == [
        93784,
        750,
        45,
        None,
        None,
        None,
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('time = "two hours"', r"Profile 'hpc', field time: 'two hours' is not a SLURM time limit.*02:00:00"),
        ("cpus_per_worker = 0", r"Profile 'hpc', field cpus_per_worker: must be a whole number of at least 1"),
        ("stop_margin = -5", r"Profile 'hpc', field stop_margin: must be a whole number of at least 0"),
        ('sbatch_args = "--qos=x"', r"Profile 'hpc', field sbatch_args: must be a list of strings"),
        ('adress = "x"', r"Profile 'hpc' in .* has field adress that a slurm profile does not use: remove it"),
    ],
)
def test_a_bad_field_is_one_line_naming_it(profile, line, message):
    profile(line + "\n")
    with pytest.raises(PoolError, match=message):
        resolve_cluster("hpc")


def test_without_sbatch_on_path_the_error_names_the_backend_field_and_the_fix(profile, tmp_path, monkeypatch):
    profile()
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PoolError, match=r"Profile 'hpc', field backend: .*needs SLURM's sbatch, which is not on PATH"):
        nbscale.Pool(2, cluster="hpc")


def test_an_unknown_partition_names_the_partition_field(slurm, profile, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    profile('partition = "nope"\n')
    with pytest.raises(PoolError, match=r"Profile 'hpc', field partition: SLURM refused the allocation .*sinfo -s"):
        nbscale.Pool(2, cluster="hpc")
    assert not queue(slurm)


def test_an_allocation_the_cluster_cannot_hold_names_the_field_to_change(slurm, profile, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    profile("cpus_per_worker = 4\n")  # the node has 2 CPUs
    # SLURM takes the job but leaves it pending for ever (PartitionConfig): it is cancelled, and the error says why
    with pytest.raises(
        PoolError,
        match=r"Profile 'hpc', field cpus_per_worker: SLURM cannot ever start job \d+ as asked "
        r"\(PENDING: PartitionConfig\); it was cancelled. Ask for fewer CPUs",
    ):
        nbscale.Pool(2, cluster="hpc")
    assert not queue(slurm) and os.environ["SLURM_CONF"] == slurm["SLURM_CONF"]
