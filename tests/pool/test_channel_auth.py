"""No code runs from an unauthenticated message: peers without the pool's secret are cut off unheard."""

from __future__ import annotations

import os
import pickle
import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from nbscale.pool.channel import AuthenticationError, ChannelListener, connect


class _Exploit:
    """Unpickling this would create a file: proof that a forged message ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _accept_in_background(listener: ChannelListener) -> dict:
    outcome: dict = {}

    def accept() -> None:
        try:
            outcome["channel"] = listener.accept(timeout=10)
        except Exception as error:  # noqa: BLE001 - the test inspects it
            outcome["error"] = error

    thread = threading.Thread(target=accept)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_forged_pickle_without_the_secret_never_runs(tmp_path):
    listener = ChannelListener(secret=b"s" * 32)
    outcome = _accept_in_background(listener)
    marker = tmp_path / "pwned"
    attacker = Connection(socket.create_connection(listener.address).detach())
    attacker.send_bytes(pickle.dumps(_Exploit(marker)))  # instead of answering the challenge
    outcome["thread"].join(15)
    listener.close()
    assert isinstance(outcome.get("error"), AuthenticationError)
    assert not marker.exists()


def test_wrong_secret_is_rejected_both_ways():
    listener = ChannelListener(secret=b"a" * 32)
    outcome = _accept_in_background(listener)
    with pytest.raises((AuthenticationError, EOFError, OSError)):
        connect(listener.address, secret=b"b" * 32)
    outcome["thread"].join(15)
    listener.close()
    assert isinstance(outcome.get("error"), AuthenticationError)


def test_right_secret_connects_and_messages_flow():
    listener = ChannelListener(secret=b"k" * 32)
    outcome = _accept_in_background(listener)
    client = connect(listener.address, secret=b"k" * 32)
    outcome["thread"].join(15)
    server = outcome["channel"]
    client.send({"hello": [1, 2, 3]})
    assert server.recv() == {"hello": [1, 2, 3]}
    listener.close()


def test_listener_binds_loopback_only():
    listener = ChannelListener(secret=b"k" * 32)
    assert listener.address[0] == "127.0.0.1"
    listener.close()
