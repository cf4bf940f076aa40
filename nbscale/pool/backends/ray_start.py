"""`ray start` that waits for its node on a busy machine: `python -m nbscale.pool.backends.ray_start ARGS...` runs
Ray's own command line (`ray ARGS...`) with one change.

Ray gives a starting node's raylet a fixed 30 s to register with the GCS (ray/_private/node.py), then gives up
and, with `--block`, ends every process it started. The raylet registers only once its agents run, Python
processes that take 5-20 s to start on a loaded node (a shared HPC node, a CI machine), so there a start fails
although nothing is wrong, and a second try meets the same load. Here each lookup Ray makes for its node waits up
to `REGISTER_WAIT_S` for the node before Ray's own count goes on, so a slow start ends in a running node and a
failed one still fails. Where Ray has no such lookup (another version), its command line runs unchanged.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

REGISTER_WAIT_S = 150.0
POLL_S = 0.5


@contextlib.contextmanager
def patient_node_lookup(wait_s: float = REGISTER_WAIT_S) -> Iterator[None]:
    """While inside, Ray's lookup of a starting node (`ray._private.services.get_node`) asks again for up to
    `wait_s` before it reports the node missing; for `ray start` and for nodes started in this process."""
    from ray._private import services

    original = getattr(services, "get_node", None)
    if original is None:
        yield
        return

    def get_node(gcs_address: str, node_id: str) -> Any:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return original(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = original


def main(arguments: list[str]) -> None:
    """Ray's command line with `arguments`, its node lookup patient (exits as Ray's does)."""
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *arguments]
    with patient_node_lookup():
        ray_main()


if __name__ == "__main__":
    main(sys.argv[1:])
