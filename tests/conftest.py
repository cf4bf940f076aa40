"""Shared fixtures: real kernels, real data written to disk, the gpu marker's skip, and how `make test` spreads the
suite over several processes (pytest-xdist, docs/development.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# Ray clusters started by tests stay on loopback: Ray reads this when imported, so it is set before any test runs.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tests.kernel_session import KernelSession

# Where nbscale keeps what outlives a call: each test process gets folders of its own (removed at its end), so
# tests running beside it, in this run or in another checkout's, never see its pools, jobs or GPU reservations.
# A test that needs a folder of its own still sets the variable itself (monkeypatch.setenv wins).
_PRIVATE_FOLDERS = {"NBSCALE_HOME": "home", "NBSCALE_RUNTIME_DIR": "runtime", "NBSCALE_GPU_REGISTRY": "gpus"}
# groups of tests that must run one after another in one process: each starts Ray clusters, which take both cores
SERIAL_GROUPS = {"ray": ("test_ray_", "test_examples_cluster")}


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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _group_for_processes(items)
    if _gpu_visible():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _group_for_processes(items: list[pytest.Item]) -> None:
    """Tell pytest-xdist (`--dist loadgroup`) which tests must share one process, and start the long ones first.

    A module whose tests share a module-scoped fixture (a pool, a Ray head) is marked to run in one process, so the
    fixture is made once; the Ray modules to run one after another (SERIAL_GROUPS). Every other test goes wherever a
    process is free. The slow-marked tests are handed out first, so no long test starts last while the others wait.

    Known gap: pytest-xdist 3.8 reads these marks by rewriting `item._nodeid`, which pytest 9 no longer reads, so
    under pytest 9.2 the marks do nothing yet: every test goes wherever a process is free, and a module fixture is
    made in each process that runs the module's tests (docs/development.md).
    """
    units: dict[str, str] = {}  # test id -> the unit xdist hands out: its group, or the test alone
    for item in items:
        module = item.nodeid.split("::")[0]
        serial = [name for name, prefixes in SERIAL_GROUPS.items() if os.path.basename(module).startswith(prefixes)]
        shares_a_fixture = any(
            definition.scope in ("module", "package", "class")
            for definitions in item._fixtureinfo.name2fixturedefs.values()
            for definition in definitions
        )
        units[item.nodeid] = item.nodeid
        if serial or shares_a_fixture:
            units[item.nodeid] = serial[0] if serial else module
            item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
    slow_units = {units[item.nodeid] for item in items if item.get_closest_marker("slow") is not None}
    # a unit's tests keep their order and stay together (a module fixture is made once)
    items.sort(key=lambda item: units[item.nodeid] not in slow_units)


@pytest.fixture
def kernel() -> Iterator[KernelSession]:
    """A fresh real kernel with `%load_ext nbscale` already run; shut down (and its pool) afterwards."""
    session = KernelSession()
    session.run("%load_ext nbscale")
    yield session
    session.run("import nbscale\np = nbscale.current_pool(start=False)\nif p is not None: p.close()", timeout=30)
    session.shutdown()
