"""Whether this machine has a working NVIDIA driver (NVML), for tests of the with- and without-GPU paths; and the
two-GPU stand-in for pynvml (tests/fake_nvml/pynvml.py) for tests that need GPUs where there are none."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

FAKE_NVML_DIR = Path(__file__).resolve().parent / "fake_nvml"


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def fake_pynvml() -> types.ModuleType:
    """A fresh copy of the stand-in, to put in sys.modules as "pynvml" (a kernel gets FAKE_NVML_DIR on its
    PYTHONPATH instead)."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
