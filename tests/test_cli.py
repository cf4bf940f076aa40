"""The `nbscale` command line, run as a user runs it: `python -m nbscale ...` in a subprocess (the console script
`nbscale` is the same `nbscale.cli:main`, installed with the package)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from tests.nvml_probe import FAKE_NVML_DIR

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 60


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job store of the test's own, shared by this process and the commands it runs."""
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def nbscale(*args: str, extra_path: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    paths = [str(extra_path)] if extra_path else []
    environment = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([*paths, str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "nbscale", *args], capture_output=True, text=True, env=environment, timeout=120
    )


@pytest.mark.slow
def test_jobs_list_show_log_cancel_and_delete_act_on_the_notebooks_job_store() -> None:
    empty = nbscale("jobs", "list")
    assert empty.returncode == 0 and empty.stdout.startswith("No jobs in "), empty
    done = jobs.submit(
        "value = 6 * 7\nfor step in range(3):\n    print(f'\\rstep {step}', end='')\nprint()\n", name="answer"
    )
    assert done.wait(WAIT_S) and done.state == "finished", done.log()
    running = jobs.submit("import time\nprint('waiting', flush=True)\ntime.sleep(600)\n", name="sleeper")
    deadline = time.monotonic() + WAIT_S
    while "waiting" not in running.log():
        assert time.monotonic() < deadline, running.log()
        time.sleep(0.05)

    listed = nbscale("jobs", "list")
    assert listed.returncode == 0, listed
    assert listed.stdout.splitlines()[0] == f"2 jobs in {jobs.default_root()}"
    assert "answer" in listed.stdout and "finished" in listed.stdout and "running" in listed.stdout

    shown = nbscale("jobs", "show", str(done.id))
    assert shown.returncode == 0 and "state      finished" in shown.stdout and "results    step, value" in shown.stdout
    assert f"folder     {done.folder}" in shown.stdout

    log = nbscale("jobs", "log", str(done.id))
    assert log.returncode == 0 and log.stdout == done.log() + ("" if done.log().endswith("\n") else "\n")
    assert "step 2\n" in log.stdout and "step 1" not in log.stdout
    assert nbscale("jobs", "log", str(done.id), "--tail", "7").stdout == done.log(tail=7)

    refused = nbscale("jobs", "delete", str(running.id))
    assert refused.returncode == 1 and "is still active, so nothing was deleted" in refused.stderr, refused
    cancelled = nbscale("jobs", "cancel", str(running.id))
    assert (cancelled.returncode, cancelled.stdout) == (0, f"Job {running.id} cancelled.\n"), cancelled
    again = nbscale("jobs", "cancel", str(running.id))
    assert again.returncode == 1 and "had already ended (cancelled)" in again.stdout
    deleted = nbscale("jobs", "delete", str(done.id), str(running.id))
    assert (deleted.returncode, deleted.stdout) == (0, f"Deleted jobs {done.id}, {running.id}.\n"), deleted
    assert jobs.list() == [] and not done.folder.exists()


def test_errors_exit_1_with_the_message_on_stderr_and_a_wrong_command_line_exits_2() -> None:
    missing = nbscale("jobs", "log", "7")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("nbscale: error: There is no job 7 in the job store at "), missing.stderr
    assert "Traceback" not in missing.stderr
    bad_age = nbscale("jobs", "delete", "--older-than", "soon")
    assert bad_age.returncode == 1 and "--older-than takes an age of 0 or more" in bad_age.stderr, bad_age
    for argv in (["jobs", "log"], ["jobs", "log", "1", "--tail", "many"], ["frobnicate"], []):
        usage = nbscale(*argv)
        assert usage.returncode == 2 and "usage: nbscale" in usage.stderr, (argv, usage)


def test_a_negative_age_gets_nbscales_one_line_message_naming_the_option_and_the_fix() -> None:
    for argv in (["--older-than", "-1d"], ["--older-than=-1d"]):
        negative = nbscale("jobs", "delete", *argv)
        assert (negative.returncode, negative.stdout) == (1, ""), negative
        assert negative.stderr == (
            "nbscale: error: --older-than takes an age of 0 or more (7d, 12h, 30m, 45s or 2w), not '-1d': for "
            "example 'nbscale jobs delete --older-than 1d'.\n"
        )


def test_version_prints_the_installed_version() -> None:
    version = nbscale("--version")
    assert (version.returncode, version.stdout) == (0, f"nbscale {importlib.metadata.version('nbscale')}\n"), version


def test_jobs_alone_lists_the_jobs_as_jobs_list_does() -> None:
    done = jobs.submit("value = 1\n", name="listed")
    assert done.wait(WAIT_S), done.log()
    alone, listed = nbscale("jobs"), nbscale("jobs", "list")
    assert alone.returncode == 0 and alone.stdout == listed.stdout and "listed" in alone.stdout, alone


def test_every_command_has_help_and_names_only_real_actions() -> None:
    top = nbscale("--help")
    assert top.returncode == 0 and all(word in top.stdout for word in ("jobs", "gpus", "doctor", "--version"))
    jobs_help = " ".join(top.stdout.split())
    assert "list, show, log, cancel and delete batch jobs" in jobs_help and "follow" not in jobs_help
    for argv, words in (
        (["jobs"], ("list", "show", "log", "cancel", "delete")),
        (["jobs", "log"], ("--tail N",)),
        (["jobs", "delete"], ("--older-than AGE", "cancel it first")),
        (["gpus"], ()),
        (["doctor"], ()),
    ):
        helped = nbscale(*argv, "--help")
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: nbscale {' '.join(argv)}"), helped
        assert all(word in " ".join(helped.stdout.split()) for word in words), helped.stdout


def test_gpus_lists_what_nvml_reports_and_says_why_there_are_none() -> None:
    two = nbscale("gpus", extra_path=FAKE_NVML_DIR)
    assert two.returncode == 0 and len([line for line in two.stdout.splitlines() if line.strip()]) >= 3, two
    none = nbscale("gpus", CUDA_VISIBLE_DEVICES="", extra_path=FAKE_NVML_DIR)
    assert none.returncode == 0 and none.stdout.startswith("No GPU visible: CUDA_VISIBLE_DEVICES=''"), none


@pytest.mark.slow
def test_doctor_reports_each_check_and_exits_1_on_a_problem(tmp_path: Path) -> None:
    found = nbscale("doctor", extra_path=FAKE_NVML_DIR)
    names = (
        "torch",
        "torchvision",
        "image decoder",
        "GPUs",
        "shared memory",
        "stale shm files",
        "job store",
        "kernel subshells",
    )
    lines = found.stdout.splitlines()
    assert [line[9:].split("  ")[0] for line in lines] == [*names, "lab extension", "Ray"], found.stdout
    assert lines[3].startswith("OK") and "2 GPUs through NVML" in lines[3]
    from nbscale.data.reading import TORCHCODEC_FAILURE

    # a torchcodec that really fails to load here (pyproject's, beside the floors' torch 2.5) is the one problem
    expected = {"image decoder"} if TORCHCODEC_FAILURE is not None else set()
    problems = {line[9:].split("  ")[0] for line in lines if line.split()[0] not in ("OK", "NOTE")}
    assert problems == expected and found.returncode == (1 if expected else 0), found.stdout
    missing = tmp_path / "no-such-folder"
    broken = nbscale("doctor", NBSCALE_SHM_DIR=str(missing), NBSCALE_HOME="/proc/nbscale")
    assert broken.returncode == 1, broken
    assert f"PROBLEM  shared memory     {missing} cannot be written" in broken.stdout
    assert "PROBLEM  job store         the check failed: JobError: The job store folder /proc/nbscale" in broken.stdout
