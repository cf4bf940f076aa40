"""No code runs from an unauthenticated message: peers without the pool's secret are cut off unheard."""

from __future__ import annotations

import os
import pickle
import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from nbscale.pool import channel as channel_module
from nbscale.pool.channel import AuthenticationError, ChannelListener, connect


class _Exploit:
    """Unpickling this would create a file: proof that a forged message ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _wait_for_refusal(listener: ChannelListener, count: int = 1, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while len(listener.refused) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_forged_pickle_without_the_secret_never_runs(tmp_path):
    listener = ChannelListener(secret=b"s" * 32)
    marker = tmp_path / "pwned"
    attacker = Connection(socket.create_connection(listener.address).detach())
    attacker.send_bytes(pickle.dumps(_Exploit(marker)))  # instead of answering the challenge
    _wait_for_refusal(listener)
    with pytest.raises(TimeoutError):
        listener.next_channel(timeout=0.2)
    listener.close()
    assert "failed authentication" in listener.refused[0]
    assert not marker.exists()


def test_wrong_secret_is_rejected_both_ways():
    listener = ChannelListener(secret=b"a" * 32)
    with pytest.raises((AuthenticationError, EOFError, OSError)):
        connect(listener.address, secret=b"b" * 32)
    _wait_for_refusal(listener)
    listener.close()
    assert len(listener.refused) == 1 and "failed authentication" in listener.refused[0]


def test_right_secret_connects_and_messages_flow():
    listener = ChannelListener(secret=b"k" * 32)
    client = connect(listener.address, secret=b"k" * 32)
    server = listener.next_channel(timeout=15)
    client.send({"hello": [1, 2, 3]})
    assert server.recv() == {"hello": [1, 2, 3]}
    listener.close()


def test_a_silent_peer_delays_no_one_and_is_refused_when_its_handshake_times_out(monkeypatch):
    monkeypatch.setattr(channel_module, "HANDSHAKE_TIMEOUT_S", 1.0)
    listener = ChannelListener(secret=b"k" * 32)
    silent = [socket.create_connection(listener.address) for _ in range(3)]  # connect, then say nothing
    started = time.monotonic()
    client = connect(listener.address, secret=b"k" * 32)
    assert listener.next_channel(timeout=15) is not None
    assert time.monotonic() - started < 1.0  # handshakes run side by side: the silent peers cost nothing
    _wait_for_refusal(listener, count=3)
    assert [reason for reason in listener.refused] == ["the peer sent nothing during the handshake"] * 3
    listener.close()
    client.close()
    for peer in silent:
        peer.close()


def test_listener_binds_loopback_only():
    listener = ChannelListener(secret=b"k" * 32)
    assert listener.address[0] == "127.0.0.1"
    listener.close()
