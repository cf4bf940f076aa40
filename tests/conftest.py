"""Shared fixtures: real kernels, real data written to disk, the gpu marker's skip, and how `make test` spreads the
suite over several processes (pytest-xdist, docs/development.md)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Ray clusters started by tests stay on loopback: Ray reads this when imported, so it is set before any test runs.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray 2.60 turns token authentication on for a local cluster when ~/.ray/auth_token exists (any `ray.init()` by hand
# writes it), and a token written while the suite runs leaves its heads and clients disagreeing ("InvalidAuthToken").
# The suite's clusters are loopback-only and its own: none reads or writes that file.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# `make test` runs several test processes on few cores: torch's intra-op threads in each (and in each kernel they
# start) would only contend, and OpenMP's waiting threads spin on cores the others need. Pool workers set their own
# count (cores // workers), as they do for users.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.kernel_session import KernelSession

# Where nbscale keeps what outlives a call: each test process gets folders of its own (removed at its end), so
# tests running beside it, in this run or in another checkout's, never see its pools, jobs or GPU reservations.
# A test that needs a folder of its own still sets the variable itself (monkeypatch.setenv wins).
_PRIVATE_FOLDERS = {"NBSCALE_HOME": "home", "NBSCALE_RUNTIME_DIR": "runtime", "NBSCALE_GPU_REGISTRY": "gpus"}
# groups of tests that must run one after another in one process: each starts Ray clusters, which take both cores
SERIAL_GROUPS = {"ray": ("test_ray_", "test_examples_cluster", "test_slurm_pool")}


def pytest_configure(config: pytest.Config) -> None:
    private = tempfile.mkdtemp(prefix="nbscale-tests-")
    config.stash[_PRIVATE_KEY] = private
    for variable, name in _PRIVATE_FOLDERS.items():
        if variable not in os.environ:
            os.mkdir(os.path.join(private, name), 0o700)
            os.environ[variable] = os.path.join(private, name)


def pytest_unconfigure(config: pytest.Config) -> None:
    private = config.stash.get(_PRIVATE_KEY, None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)


_PRIVATE_KEY = pytest.StashKey[str]()


def _gpu_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _long_units_first(items)
    if _gpu_visible():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out whole units (work_unit): a test alone, or the tests that must share one process.

    (xdist's own `--dist loadgroup` marks do nothing under pytest 9, which no longer takes the node id xdist
    rewrites; a scheduler whose scope is the unit does the same.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


def work_unit(nodeid: str) -> str:
    """The unit a test is handed out in: "ray" for the Ray modules (one after another in one process: each cluster
    takes both cores), its module when the module's tests share a module-scoped fixture (a pool, a Ray head: made
    once), else the test alone, to go wherever a process is free."""
    module = nodeid.split("::")[0]
    for name, prefixes in SERIAL_GROUPS.items():
        if os.path.basename(module).startswith(prefixes):
            return name
    return module if _shares_a_module_fixture(module) else nodeid


@functools.cache
def _shares_a_module_fixture(module: str) -> bool:
    """Whether the test file defines a module-scoped fixture, or takes its folder's (tests/training's `pool`)."""
    path = Path(__file__).parent.parent / module
    try:
        source = path.read_text()
    except OSError:
        return False
    if 'scope="module"' in source or 'scope="class"' in source:
        return True
    folder_fixtures = _module_fixtures_of_conftest(path.parent)
    return any(re.search(rf"def test_\w+\([^)]*\b{name}\b", source) for name in folder_fixtures)


@functools.cache
def _module_fixtures_of_conftest(folder: Path) -> tuple[str, ...]:
    """The names of the module-scoped fixtures the folder's conftest.py defines."""
    try:
        source = (folder / "conftest.py").read_text()
    except OSError:
        return ()
    return tuple(re.findall(r'@pytest\.fixture\(scope="module"\)\s*\ndef (\w+)', source))


def _long_units_first(items: list[pytest.Item]) -> None:
    """Start the units holding slow-marked tests first, so no long test starts last while the others wait; a unit's
    tests keep their order and stay together (a module fixture is made once)."""
    slow_units = {work_unit(item.nodeid) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: work_unit(item.nodeid) not in slow_units)


@pytest.fixture
def kernel() -> Iterator[KernelSession]:
    """A fresh real kernel with `%load_ext nbscale` already run; shut down (and its pool) afterwards."""
    session = KernelSession()
    try:
        session.run("%load_ext nbscale")
    except BaseException:
        session.shutdown()
        raise
    yield session
    session.close()
