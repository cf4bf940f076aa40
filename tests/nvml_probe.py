"""Whether this machine has a working NVIDIA driver (NVML), for tests of the with- and without-GPU paths."""

from __future__ import annotations


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False
