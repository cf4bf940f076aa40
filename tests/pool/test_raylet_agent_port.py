"""nbscale.pool.backends.ray_start: the raylet is told its dashboard agent's listen port (Ray 2.x leaves it out, and
the raylet then waits a fixed 15 s for the agent, too short on a loaded machine). The Ray heads of the Ray and SLURM
tests all start through it."""

from __future__ import annotations

from nbscale.pool.backends.ray_start import RAYLET_FLAG, raylet_command_with_agent_port

AGENT = "--dashboard_agent_command=/venv/bin/python -u agent.py --grpc-port=41000 --listen-port={port} --head"


def test_the_raylet_gets_the_port_ray_gave_the_agent():
    command = ["raylet", "--metrics-agent-port=41000", AGENT.format(port=52365)]
    assert raylet_command_with_agent_port(command) == [*command, f"{RAYLET_FLAG}=52365"]


def test_a_port_the_agent_picks_itself_or_a_flag_already_given_leaves_the_command_as_ray_made_it():
    picked_by_agent = ["raylet", AGENT.format(port=0)]
    assert raylet_command_with_agent_port(picked_by_agent) == picked_by_agent
    already = ["raylet", AGENT.format(port=52365), f"{RAYLET_FLAG}=52365"]
    assert raylet_command_with_agent_port(already) == already
    no_agent = ["raylet", "--node_id=abc"]
    assert raylet_command_with_agent_port(no_agent) == no_agent
