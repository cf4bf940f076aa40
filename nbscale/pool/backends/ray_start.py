"""Ray nodes that start on a busy machine: `python -m nbscale.pool.backends.ray_start ARGS...` is Ray's own command
line (`ray ARGS...`, such as `ray start --head ...`) with one change, which `give_raylet_the_agent_port()` also makes
for nodes started inside a process (`ray.init()` with no address).

Ray (2.x) tells a node's raylet the ports of its metrics agent and runtime-env agent, but not the listen port of its
dashboard agent, although the raylet has a flag for it (`--dashboard_agent_listen_port`). Without it, the raylet
waits for the agent to write that port to a file, a fixed 15 s, and then aborts: the node never registers and
`ray start` fails 30 s later ("The current node timed out during startup"). The agent is a Python process that takes
5 s to start on a quiet 2-core machine and over 15 s on a loaded one (a shared HPC node, a CI machine), so there
every start fails, however often it is tried. The change hands the raylet the port Ray already gave the agent
(its `--listen-port`), as Ray does for the other agents: the raylet starts without waiting, the agent binds the
same port as before. Where the agent's port is not a fixed number, or the raylet already has the flag (a Ray that
passes it), the raylet's command line is left as Ray made it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

# Ray's command line with that change, in this Python
RAY_COMMAND = (sys.executable, "-m", "nbscale.pool.backends.ray_start")
RAYLET_FLAG = "--dashboard_agent_listen_port"
_AGENT_LISTEN_PORT = re.compile(r"--listen-port=(\d+)")


def raylet_command_with_agent_port(command: list[str]) -> list[str]:
    """The raylet's command line with the dashboard agent's listen port (from the agent's command, which the
    raylet starts) passed to the raylet too; unchanged where there is no such fixed port or the flag is there."""
    if any(part.startswith(RAYLET_FLAG) for part in command):
        return command
    agent = next((part for part in command if part.startswith("--dashboard_agent_command=")), "")
    match = _AGENT_LISTEN_PORT.search(agent)
    if match is None or int(match[1]) == 0:
        return command
    return [*command, f"{RAYLET_FLAG}={match[1]}"]


def give_raylet_the_agent_port() -> None:
    """From now on, every raylet this process starts (`ray start`, `ray.init()` starting a local node) is told its
    dashboard agent's listen port instead of waiting 15 s for it. Idempotent; a Ray without the hook is left as is."""
    from ray._private import ray_constants, services

    original = services.start_ray_process
    if getattr(original, "_gives_agent_port", False):
        return

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = raylet_command_with_agent_port(list(command))
        return original(command, process_type, *args, **kwargs)

    start_ray_process._gives_agent_port = True  # type: ignore[attr-defined]
    services.start_ray_process = start_ray_process


def main(arguments: list[str]) -> None:
    """Ray's command line with `arguments`, its raylets told their agent's port (exits as Ray's does)."""
    from ray.scripts.scripts import main as ray_main

    give_raylet_the_agent_port()
    sys.argv = ["ray", *arguments]
    ray_main()


if __name__ == "__main__":
    main(sys.argv[1:])
