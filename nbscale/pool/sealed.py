"""Sealed pickles between a pool's workers: a worker unpickles what a peer sent only if the pool's key signed it.

torch.distributed's own connections (gloo, NCCL) are not authenticated: a process that joins a forming group could
pose as a worker. So every pickle a worker sends its peers is sealed: an HMAC-SHA256, keyed from the pool's
secret, over the sender's global rank and the bytes. A receiver checks it (`hmac.compare_digest`) before
unpickling, so bytes without the key, or one rank's bytes passed off as another's, run nothing.

The key is held in this module, set once when a worker starts (`hold_pool_key`): it never travels in a message
and is in no namespace a cell sees. Only pool workers run these collectives (the notebook's own process has no
group of several ranks).
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nbscale.errors import PoolError

_PURPOSE = b"nbscale collectives"  # the key is derived for this use alone, apart from the channels' handshake
_TAG_SIZE = hashlib.sha256().digest_size


@dataclass
class _Held:
    key: bytes | None = None  # this worker's key for peers' messages, derived once by hold_pool_key


_held = _Held()


def hold_pool_key(secret: bytes) -> None:
    """Derive this worker's key for peers' messages from the pool's secret and keep it for `pool_key`."""
    _held.key = hmac.new(secret, _PURPOSE, hashlib.sha256).digest()


def pool_key() -> bytes:
    """The key `hold_pool_key` derived; RuntimeError outside a pool worker, which has none."""
    if _held.key is None:
        raise RuntimeError("nbscale's sealed collectives run only in a pool worker, which holds the pool's key.")
    return _held.key


def seal(key: bytes, rank: int, payload: bytes) -> bytes:
    """`payload` sent by global rank `rank`, with its tag in front."""
    return _tag(key, rank, payload) + payload


def open_sealed(key: bytes, rank: int, data: bytes) -> bytes:
    """The payload of `data`, which global rank `rank` sealed; PoolError if its tag does not match (it is then
    never unpickled)."""
    tag, payload = data[:_TAG_SIZE], data[_TAG_SIZE:]
    if len(tag) < _TAG_SIZE or not hmac.compare_digest(tag, _tag(key, rank, payload)):
        raise PoolError(
            f"A message from worker {rank} failed authentication (it is not signed with this pool's key), so it was "
            "not unpickled: a process that is not one of this pool's workers may have joined the workers' "
            "torch.distributed group. Restart the pool (%pool restart, or pool.restart()), and keep other users "
            "of this machine off it (docs/security.md)."
        )
    return payload


def all_gather_objects(value: object, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every group member's `value` (picklable), in the group's rank order, on every member, sealed on the way.

    Two collectives of CPU tensors (every nbscale group has gloo, GPU pools too): the sealed lengths, then the
    sealed bytes padded to the longest. PoolError names a member whose bytes fail authentication.
    """
    key = pool_key()
    senders = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    mine = seal(key, dist.get_rank(), pickle.dumps(value))
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in senders]
    dist.all_gather(lengths, torch.tensor([len(mine)], dtype=torch.int64), group=group)
    longest = max(int(length) for length in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    received = [torch.empty(longest, dtype=torch.uint8) for _ in senders]
    dist.all_gather(received, padded, group=group)
    return [
        pickle.loads(open_sealed(key, sender, data[: int(length)].numpy().tobytes()))
        for sender, data, length in zip(senders, received, lengths, strict=True)
    ]


def _tag(key: bytes, rank: int, payload: bytes) -> bytes:
    return hmac.new(key, rank.to_bytes(8, "big") + payload, hashlib.sha256).digest()
