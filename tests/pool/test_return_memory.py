"""Large return values cost the kernel at most about twice their size at the peak (issue 29.8: two 2.1 GB values
peaked at 4x): out-of-band buffers are read straight into place, a pickled body is not copied on its way.

The kernel's peak is this process's VmHWM, reset before each call (/proc/self/clear_refs); sizes are 128 MiB.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

import nbscale
from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE

SIZE = 128 * 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _peak_and_held(pool: nbscale.Pool, make) -> tuple[float, float]:
    """(peak, held) of the kernel's memory over one `pool.run(make)`, in multiples of SIZE."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak starts again from now
    before = _status("VmRSS")
    value = pool.run(make)[0]
    touched = value.sum() if isinstance(value, torch.Tensor) else len(value)  # every page read
    assert touched
    return (_status("VmHWM") - before) / SIZE, (_status("VmRSS") - before) / SIZE


def _tensor():
    return torch.ones(SIZE // 4)


def _bytes():
    return b"x" * SIZE


@pytest.fixture(scope="module", params=["shared memory", "socket"])
def pool(request, tmp_path_factory):
    """One pool per way large values travel, shared by the module's tests (each measures one call)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        if request.param == "socket":  # a folder others can write is not used: large values take the socket
            folder = tmp_path_factory.mktemp("open")
            os.chmod(folder, 0o777)
            monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
        with nbscale.Pool(1, cpu=True) as started:
            started.run(int)
            yield started


def test_a_returned_tensor_costs_the_kernel_about_its_size(pool):
    peak, held = _peak_and_held(pool, _tensor)
    assert peak < 1.3 and held < 1.3, (peak, held)


def test_a_returned_bytes_value_costs_the_kernel_at_most_twice_its_size(pool):
    peak, held = _peak_and_held(pool, _bytes)  # pickled in band: the message, then the value
    assert peak < 2.3 and held < 1.3, (peak, held)
