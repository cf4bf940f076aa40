"""The package's metadata as a maintainer publishes it: a BSD-3-Clause LICENSE shipped with it, classifiers, project
URLs, and one version, written in pyproject.toml and read back from the installed metadata."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import nbscale

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_license_is_bsd_3_clause_in_a_license_file_the_distributions_carry() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License\n\nCopyright (c) 2026, nbscale contributors\n")
    assert "Neither the name of the copyright holder nor the names of its" in text
    assert (PROJECT["license"], PROJECT["license-files"]) == ("BSD-3-Clause", ["LICENSE"])


def test_classifiers_name_python_jupyter_the_prebuilt_extension_and_the_platforms_but_no_license() -> None:
    classifiers = set(PROJECT["classifiers"])
    assert {
        "Programming Language :: Python :: 3.11",
        "Framework :: Jupyter",
        "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Operating System :: POSIX :: Linux",
    } <= classifiers
    assert not [name for name in classifiers if name.startswith("License ::")]  # PEP 639: `license` says it


def test_project_urls_point_at_the_repository() -> None:
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Issues", "Changelog"}
    assert all(url.startswith("https://github.com/nbscale/nbscale") for url in urls.values())


def test_the_version_is_written_only_in_pyproject_and_read_from_the_installed_metadata() -> None:
    assert nbscale.__version__ == importlib.metadata.version("nbscale") == PROJECT["version"], (
        "the installed metadata is older than pyproject.toml: reinstall (pip install -e .)"
    )
    written = re.compile(r"""__version__\s*=\s*["']""")
    assert not [path for path in (REPO / "nbscale").rglob("*.py") if written.search(path.read_text())]


def test_the_version_is_0_unknown_where_nbscale_is_not_installed() -> None:
    code = (
        "import importlib.metadata as metadata\n"
        "def version(name):\n"
        "    raise metadata.PackageNotFoundError(name)\n"
        "metadata.version = version\n"
        "import nbscale\n"
        "print(nbscale.__version__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert (result.returncode, result.stdout) == (0, "0+unknown\n"), result.stderr


FLOORED = ("torch", "torchvision", "numpy", "pillow", "ipython", "ipykernel")


def test_the_torch_stack_numpy_pillow_and_ipython_have_floors_that_make_test_oldest_pins() -> None:
    floors = {}
    for requirement in PROJECT["dependencies"]:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if found:
            floors[found[1].lower()] = found[2]
    pins = dict(
        line.split("==")
        for line in (REPO / "requirements" / "oldest" / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(pins) == set(FLOORED) <= set(floors), (pins, floors)
    for name in FLOORED:  # each pin is a release of the floor's series, at or above it
        assert pins[name].split(".")[:2] == floors[name].split(".")[:2], (name, pins[name], floors[name])
    assert floors["ipython"] == "7.34"  # Colab's IPython: a higher floor would upgrade it


@pytest.mark.slow
def test_the_wheel_passes_twine_check_and_check_wheel_contents(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = str(next(dist.glob("nbscale-*.whl")))
    tools = Path(sys.executable).parent
    twine = subprocess.run([tools / "twine", "check", "--strict", wheel], capture_output=True, text=True, timeout=120)
    assert twine.returncode == 0 and "PASSED" in twine.stdout, twine.stdout + twine.stderr
    contents = subprocess.run([tools / "check-wheel-contents", wheel], capture_output=True, text=True, timeout=120)
    assert contents.returncode == 0 and contents.stdout.endswith(": OK\n"), contents.stdout + contents.stderr
