"""TrainingOptions(compile=...): the network trains compiled by torch.compile (on the CPU here, with the C++
compiler), comes back as the plain module, and trains eagerly with one warning where it cannot compile."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import nbscale
from nbscale import TrainingOptions
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()

pytestmark = pytest.mark.slow  # compiling takes seconds


def options(**fields: object) -> TrainingOptions:
    base = {
        "initial_learn_rate": 0.1,
        "max_epochs": 2,
        "mini_batch_size": 64,
        "verbose": False,
        "validation_data": VAL,
        "validation_frequency": 10,
    }
    return TrainingOptions("sgdm", **{**base, **fields})


def test_a_compiled_network_trains_like_the_eager_one_and_comes_back_plain() -> None:
    eager, eager_info = nbscale.train(tiny_net(), TRAIN, options())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it compiles: no fallback warning
        net, info = nbscale.train(tiny_net(), TRAIN, options(compile=True))
    assert type(net) is nn.Sequential and not isinstance(net, torch._dynamo.eval_frame.OptimizedModule)
    assert info.training_loss[-1] < 0.5 * info.training_loss[0] and info.final_validation_accuracy > 0.85
    # the same updates, up to the order of floating-point operations in the fused kernels
    assert all(torch.allclose(p, q, atol=1e-4) for p, q in zip(eager.parameters(), net.parameters(), strict=True))
    assert info.training_loss == pytest.approx(eager_info.training_loss, abs=1e-4)
    assert info.validation_loss[-1] == pytest.approx(eager_info.validation_loss[-1], abs=1e-4)
    # compiling is timed apart, before training (an eager run compiles nothing)
    assert eager_info.compile_seconds == 0.0 and info.compile_seconds > 0.0


def test_a_network_that_cannot_compile_trains_eagerly_and_says_so_once(tmp_path) -> None:
    # CXX names no compiler: inductor cannot build the kernels, as on a machine without a working C++ compiler
    script = textwrap.dedent("""
        import warnings
        import torch
        import nbscale
        from tests.training.digits import digits, tiny_net
        train, _ = digits()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            net, info = nbscale.train(tiny_net(), train, nbscale.TrainingOptions(
                "sgdm", initial_learn_rate=0.1, max_epochs=2, mini_batch_size=64, verbose=False, compile=True))
        messages = [str(w.message) for w in caught if "compile" in str(w.message)]
        print(len(messages), type(net).__name__, info.stop_reason)
        print(messages[0] if messages else "")
        print(info.training_loss[-1] < 0.5 * info.training_loss[0])
    """)
    environment = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert result.returncode == 0, result.stderr
    counts, message, learned = result.stdout.strip().splitlines()[-3:]
    count, kind, finished = counts.split(" ", 2)
    assert count == "1" and kind == "Sequential" and finished == "Max epochs completed"
    assert "could not be compiled" in message and "No working C++ compiler" in message and learned == "True"


def test_compiling_shows_none_of_torchs_unactionable_notes_in_the_cell(kernel) -> None:
    """Torch logs a CUDA build's missing GPU in the notebook's process and DDP's skipped profiler ranges on each pool
    worker while compiling; neither is anything a user can act on."""
    cell = textwrap.dedent("""
        import nbscale
        from tests.training.digits import digits, tiny_net
        train, _ = digits()
        for environment in ("cpu", "parallel"):
            net, info = nbscale.train(tiny_net(), train, nbscale.TrainingOptions(
                "sgdm", initial_learn_rate=0.1, max_epochs=1, mini_batch_size=64, verbose=False, plots="none",
                compile=True, execution_environment=environment))
            print(environment, info.stop_reason)
    """)
    result = kernel.run(cell, timeout=500)
    assert result.ok, result.text
    assert "cpu Max epochs completed\nparallel Max epochs completed" in result.stdout, result.text
    assert "No CUDA runtime" not in result.text and "will be ignored" not in result.text, result.text
