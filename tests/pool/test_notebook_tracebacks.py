"""A worker's traceback of a function defined in the notebook names the notebook cell and shows its line, on
every way a function reaches the workers, whichever cloudpickle is installed (3.1.3 renames every pickled
function's file to "<dynamic-code>"; nbscale sends code objects whole, so the name survives)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.kernel_session import KernelSession, cell_name

pytestmark = pytest.mark.slow

SCALE = "def scale(value):\n    factor = 10\n    return value * factor / (value - 2)\n"
LINE = "    return value * factor / (value - 2)\nZeroDivisionError"


@pytest.fixture(scope="module", params=["installed", "3.1.2"])
def kernel_with_pool(request, tmp_path_factory):
    """A kernel with `pool` (1 CPU worker), with the installed cloudpickle or with 3.1.2 put first on its path."""
    env = {}
    if request.param != "installed":
        target = tmp_path_factory.mktemp("cloudpickle")
        installed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                f"cloudpickle=={request.param}",
            ],
            capture_output=True,
            text=True,
        )
        if installed.returncode != 0:
            pytest.skip(f"cloudpickle {request.param} cannot be installed here: {installed.stderr[-300:]}")
        env["PYTHONPATH"] = str(target)
    session = KernelSession(env=env)
    session.run("%load_ext nbscale")
    version = session.run("import cloudpickle; print(cloudpickle.__version__)").stdout.strip()
    if request.param != "installed":
        assert version == request.param
    started = session.run("%pool start 1 --cpu\nimport nbscale\npool = nbscale.current_pool()")
    assert started.ok, started.text
    session.run(SCALE)
    yield session
    session.close("pool.close()")


@pytest.mark.parametrize("call", ["pool.run(scale, 2)", "pool.submit(scale, 2).result()", "list(pool.map(scale, [2]))"])
def test_a_notebook_functions_traceback_from_a_worker_shows_its_cell_and_line(kernel_with_pool, call) -> None:
    cell = kernel_with_pool.run(call)
    assert cell.error_name is not None, cell.text
    assert re.search(cell_name() + r", line 3, in scale\n" + re.escape(LINE), cell.traceback), cell.traceback
    assert "<dynamic-code>" not in cell.traceback


def test_a_notebook_loss_that_fails_in_training_on_the_pool_shows_its_cell_and_line(kernel_with_pool) -> None:
    defined = kernel_with_pool.run("def broken_loss(outputs, labels):\n    return outputs.sum() / 0 + undefined_name\n")
    assert defined.ok
    cell = kernel_with_pool.run(
        "import torch\n"
        "data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))\n"
        "opts = nbscale.TrainingOptions(max_epochs=1, mini_batch_size=8, verbose=False, "
        "execution_environment='parallel')\n"
        "nbscale.train(torch.nn.Linear(4, 2), data, opts, loss_fn=broken_loss)"
    )
    assert cell.error_name is not None, cell.text
    assert re.search(cell_name() + r", line 2, in broken_loss\n", cell.traceback), cell.traceback
    assert "undefined_name" in cell.traceback
    assert "<dynamic-code>" not in cell.traceback
