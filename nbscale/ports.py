"""Free TCP ports for services nbscale starts (Ray's, in a SLURM allocation), picked all at once: each is bound
until every one is, so no two are the same port (the system may hand out a port just released again)."""

from __future__ import annotations

import socket
from collections.abc import Collection
from contextlib import ExitStack


def free_ports(count: int, host: str = "127.0.0.1", taken: Collection[int] = ()) -> list[int]:
    """`count` distinct ports free on `host` now, none of them in `taken` (ports picked earlier, not yet used);
    another process may still take one before it is used."""
    ports: list[int] = []
    with ExitStack() as bound:
        while len(ports) < count:
            probe = bound.enter_context(socket.socket())
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
            if port not in taken:
                ports.append(port)
    return ports
