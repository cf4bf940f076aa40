"""Where running pools publish their state for the Jupyter server extension (and anyone else on the machine).

Each pool writes one JSON file, `<jupyter runtime dir>/nbscale/pools/<kernel pid>.json`, readable by the user
only, and rewrites it at least every `HEARTBEAT_S` seconds. Readers drop files whose process is gone or whose
heartbeat is older than `STALE_AFTER_S`, so a pool that died leaves no stale entry.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from nbscale.processes import pid_running

HEARTBEAT_S = 3.0
STALE_AFTER_S = 10.0


def registry_dir() -> Path:
    """The folder of pool files (created 0700 on first publish). `NBSCALE_RUNTIME_DIR` overrides it."""
    override = os.environ.get("NBSCALE_RUNTIME_DIR")
    if override:
        return Path(override) / "pools"
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "nbscale" / "pools"


def _own_file() -> Path:
    return registry_dir() / f"{os.getpid()}.json"


def publish(state: dict[str, Any]) -> None:
    """Atomically write this process's pool state (plus pid and heartbeat time).

    Raises ValueError for a number JSON cannot hold (NaN, infinity): readers never see one.
    """
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    record = {**state, "pid": os.getpid(), "heartbeat": time.time()}
    text = json.dumps(record, allow_nan=False)
    temporary = folder / f".{os.getpid()}.json.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, _own_file())


def withdraw() -> None:
    """Remove this process's pool file (the pool stopped)."""
    try:
        _own_file().unlink()
    except FileNotFoundError:
        pass


def kernel_id() -> str | None:
    """The Jupyter kernel id of this process (from its connection file), or None outside a kernel."""
    if "ipykernel.kernelapp" not in sys.modules:
        # not a kernel: importing ipykernel here, on the monitor thread, would import IPython under the feet of
        # the main thread, which reads sys.modules["IPython"] to name notebook cells in a worker's traceback
        return None
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # noqa: BLE001 - not a kernel, or ipykernel cannot tell
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") and name.endswith(".json") else None


def _refuse_non_finite(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def read_all(stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
    """Every live pool's state; files of dead processes or stale heartbeats are removed on the way."""
    folder = registry_dir()
    if not folder.is_dir():
        return []
    pools = []
    now = time.time()
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(), parse_constant=_refuse_non_finite)
        except (OSError, ValueError):
            continue
        fresh = now - float(record.get("heartbeat", 0)) <= stale_after_s
        if fresh and pid_running(int(record.get("pid", -1))):
            pools.append(record)
        else:
            path.unlink(missing_ok=True)
    return pools
