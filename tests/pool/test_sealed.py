"""No worker unpickles a peer's bytes unless the pool's key signed them for that peer's rank
(nbscale.pool.sealed): gloo's own connections are not authenticated, so a process posing as a worker must not be
able to run code in the others."""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from pathlib import Path
from typing import Any

import pytest

from nbscale.errors import PoolError
from nbscale.pool.sealed import hold_pool_key, open_sealed, pool_key, seal
from tests.crafted_pickles import Payload

KEY = b"k" * 32


def test_a_sealed_message_opens_only_unchanged_with_its_key_and_its_senders_rank() -> None:
    payload = pickle.dumps({"from": 1})
    sealed = seal(KEY, 1, payload)
    assert open_sealed(KEY, 1, sealed) == payload
    tampered = bytearray(sealed)
    tampered[-1] ^= 1
    refusals = {
        "tampered": (KEY, 1, bytes(tampered)),
        "another rank's": (KEY, 2, sealed),
        "another key's": (b"x" * 32, 1, sealed),
        "cut short": (KEY, 1, sealed[:10]),
        "unsealed": (KEY, 1, payload),
    }
    for case, (key, rank, data) in refusals.items():
        with pytest.raises(PoolError, match=f"A message from worker {rank} failed authentication") as caught:
            open_sealed(key, rank, data)
        assert "not unpickled" in str(caught.value), case


def _member(rank: int, store_file: str, secret: bytes, attack: str | None, results: Any) -> None:
    """One process of a 2-process gloo group, holding a key derived from `secret`. Rank 1 sends a value whose
    unpickling would run `touch <attack>` (None: rank 1 sends its rank, as rank 0 does)."""
    import torch.distributed as dist

    from nbscale.pool.collectives import Collectives
    from nbscale.pool.sealed import all_gather_objects

    hold_pool_key(secret)
    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    sent = Payload(Path(attack)) if rank == 1 and attack is not None else rank
    outcomes = []
    for collective in (
        lambda: all_gather_objects(sent),
        lambda: Collectives().broadcast(sent, src=1),
        lambda: Collectives().allreduce(sent),
    ):
        try:
            outcomes.append(("ok", repr(collective())))  # a repr: the test process unpickles it
        except Exception as error:  # reported to the test
            outcomes.append((type(error).__name__, str(error) or traceback.format_exc()))
    results.put((rank, outcomes))
    dist.destroy_process_group()


def _run_group(tmp_path: Path, secrets: tuple[bytes, bytes], attack: Path | None) -> dict[int, list[tuple[str, str]]]:
    """Each rank's outcomes of all_gather_objects, broadcast and allreduce in a real 2-process gloo group."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    members = [
        context.Process(
            target=_member,
            args=(rank, str(tmp_path / "store"), secrets[rank], str(attack) if attack else None, results),
        )
        for rank in (0, 1)
    ]
    for member in members:
        member.start()
    outcomes = dict(results.get(timeout=120) for _ in members)
    for member in members:
        member.join(timeout=30)
    return outcomes


@pytest.mark.slow
def test_a_peer_without_the_pools_key_is_refused_and_its_pickle_never_runs(tmp_path: Path) -> None:
    attack = tmp_path / "ran"
    outcomes = _run_group(tmp_path, (b"pool secret", b"another secret"), attack)
    assert not attack.exists()
    assert len(outcomes[0]) == 3  # the honest rank 0 refuses rank 1's bytes in each collective
    for kind, text in outcomes[0]:
        assert kind == "PoolError" and text.startswith("A message from worker 1 failed authentication"), text


@pytest.mark.slow
def test_peers_holding_the_pools_key_exchange_objects(tmp_path: Path) -> None:
    outcomes = _run_group(tmp_path, (b"pool secret", b"pool secret"), None)
    for rank in (0, 1):
        assert outcomes[rank] == [("ok", "[0, 1]"), ("ok", "1"), ("ok", "1")]


def test_outside_a_pool_worker_there_is_no_key_to_open_peers_messages() -> None:
    with pytest.raises(RuntimeError, match="only in a pool worker"):
        pool_key()
