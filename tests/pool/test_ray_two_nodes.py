"""A pool across a Ray cluster of two nodes on this machine (Ray's own multi-node test cluster): placement, spmd
and training across nodes, a node lost mid-training, and a restart once a replacement node joined.

Ray takes ~15 s to start a head here, so this is one test that checks everything in turn."""

from __future__ import annotations

import threading
import time

import pytest

import nbscale
from nbscale.errors import WorkerError
from nbscale.pool.backends.ray_start import give_raylet_the_agent_port
from nbscale.ports import free_ports
from tests.ray_head import forget_cluster_address
from tests.training.digits import digits, tiny_net

# two trainings, a lost node and a restart: ~2 min on a quiet 2-core machine, over 5 beside a loaded one
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")


def _agent_ports(nodes: int) -> list[dict[str, int]]:
    """Each agent's port of each node picked here (all distinct), so the node's raylet knows them and does not wait
    for its agents to start (with give_raylet_the_agent_port: nbscale.pool.backends.ray_start); a loaded machine
    exceeds that fixed wait."""
    names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
    ports = iter(free_ports(len(names) * nodes))
    return [{name: next(ports) for name in names} for _ in range(nodes)]


@pytest.fixture
def two_nodes():
    """A head and a second node, one CPU each, so a pool of two must use both (and the ports of a third, which
    may join later)."""
    give_raylet_the_agent_port()  # the nodes start in this process
    head_ports, second_ports, third_ports = _agent_ports(3)
    head_node_args = {"num_cpus": 1, "include_dashboard": False, **head_ports}
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=head_node_args)
    try:
        second = cluster.add_node(num_cpus=1, **second_ports)
        cluster.wait_for_nodes()
        yield cluster, second, third_ports
    finally:
        pool = nbscale.current_pool()
        if pool is not None:
            pool.close()
        ray.shutdown()
        cluster.shutdown()
        forget_cluster_address(cluster.address)


def _nodes(pool: nbscale.Pool) -> list[str]:
    """Each worker's node id (8 characters) as the pool's status shows it."""
    return [w.host.split("(node ")[1][:8] for w in pool.status().workers]


def test_a_pool_spreads_over_two_nodes_trains_across_them_names_a_lost_node_by_rank_and_restarts(two_nodes):
    cluster, second, third_ports = two_nodes
    (train_x, train_y), validation = digits()
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=0.1,
        mini_batch_size=64,
        max_epochs=6,
        validation_data=validation,
        execution_environment="parallel",
        plots="none",
        verbose=False,
    )
    pool = nbscale.Pool(2, cluster=cluster.address, connect_timeout=180)

    # each worker's node shows in the status, and the two workers are on different nodes
    nodes = _nodes(pool)
    assert len(set(nodes)) == 2 and second.node_id[:8] in nodes
    table = repr(pool.status())
    assert all(f"node {node} at 127.0.0.1" in table for node in nodes), table

    # spmd and "parallel" training across the nodes
    namespace: dict = {}
    pool.spmd("total = allreduce(rank + 1)", namespace=namespace)
    assert namespace["total"][:] == [3, 3]
    net, info = nbscale.train(tiny_net(), (train_x, train_y), options)
    assert "2 workers" in info.hardware and info.final_validation_accuracy > 0.85

    # the second node dies mid-training: the training fails naming the rank that was there
    lost_rank = nodes.index(second.node_id[:8])
    removed_at: list[float] = []
    threading.Timer(
        3.0, lambda: (removed_at.append(time.monotonic()), cluster.remove_node(second, allow_graceful=False))
    ).start()
    with pytest.raises(WorkerError) as failed:
        nbscale.train(tiny_net(), (train_x, train_y), options.replace(max_epochs=5000))
    detected_s = time.monotonic() - removed_at[0]
    print(f"lost node reported after {detected_s:.1f} s")
    assert detected_s < 30
    message = str(failed.value)
    assert f"Training failed on worker {lost_rank}" in message, message
    assert f"worker {lost_rank} (pid" in message and f"node {second.node_id[:8]}" in message, message
    assert "%pool restart" in message
    assert [w.state for w in pool.status().workers][lost_rank] == "dead"

    # a replacement node joins; %pool restart (pool.restart()) gives two fresh workers that train again
    cluster.add_node(num_cpus=1, **third_ports)
    cluster.wait_for_nodes()
    pool.restart()
    assert len(set(_nodes(pool))) == 2 and second.node_id[:8] not in _nodes(pool)
    pool.spmd("total = allreduce(rank + 1)", namespace=namespace)
    assert namespace["total"][:] == [3, 3]
    net, info = nbscale.train(tiny_net(), (train_x, train_y), options.replace(max_epochs=2))
    assert info.stop_reason == "Max epochs completed"
