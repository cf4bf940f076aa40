"""An authenticated, message-framed connection between the kernel and one worker.

Both ends prove they hold the pool's secret (mutual HMAC-SHA256 challenge-response) before either unpickles
a single byte from the other: a peer without the secret gets its connection closed and nothing it sent runs.
TCP is used so that the same channel crosses machines (the cluster backend); locally it binds loopback only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import queue
import secrets
import socket
import struct
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from nbscale.pool import mappings
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.transport import (
    Frame,
    deserialise,
    empty_bytes,
    map_shared_memory,
    serialise,
    warn_shared_memory_failure,
)

_GREETING = b"NBSCALE1"
_CHALLENGE_BYTES = 32
HANDSHAKE_TIMEOUT_S = 10.0
MAX_CONCURRENT_HANDSHAKES = 256


def machine_id() -> str:
    """Identifies this machine (and boot), so peers know whether shared memory reaches them."""
    for path in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        try:
            with open(path) as handle:
                return socket.gethostname() + ":" + handle.read().strip()
        except OSError:
            continue
    return socket.gethostname()


def _read_exactly(descriptor: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(descriptor, size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class AuthenticationError(ConnectionError):
    """The peer did not prove it holds the pool's secret."""


class MessageUnreadable(Exception):
    """A message arrived whole but could not be unpickled here (e.g. it names a module this side lacks).

    The channel stays usable; `kind`, `request_id` and `rank` say which message it was, so the request it
    belongs to can fail with `error` instead of waiting forever.
    """

    def __init__(self, kind: str, request_id: int | None, rank: int | None, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.kind, self.request_id, self.rank, self.error = kind, request_id, rank, error


def _digest(secret: bytes, role: bytes, challenge: bytes) -> bytes:
    return hmac.new(secret, role + challenge, hashlib.sha256).digest()


def _receive_small(connection: Connection, limit: int) -> bytes:
    if not connection.poll(HANDSHAKE_TIMEOUT_S):
        raise AuthenticationError("the peer sent nothing during the handshake")
    try:
        return connection.recv_bytes(maxlength=limit)
    except OSError as error:  # a message over `limit` bytes: not a real peer
        raise AuthenticationError(f"the peer's handshake message was malformed ({error})") from None


def authenticate_client(connection: Connection, secret: bytes) -> None:
    """Server side: challenge the connecting peer, then prove ourselves to it."""
    challenge = secrets.token_bytes(_CHALLENGE_BYTES)
    connection.send_bytes(_GREETING + challenge)
    reply = _receive_small(connection, 2 * _CHALLENGE_BYTES + 64)
    response, peer_challenge = reply[:32], reply[32:]
    if len(peer_challenge) != _CHALLENGE_BYTES or not hmac.compare_digest(
        response, _digest(secret, b"worker", challenge)
    ):
        raise AuthenticationError("a connection to the pool failed authentication and was closed")
    connection.send_bytes(_digest(secret, b"kernel", peer_challenge))


def authenticate_server(connection: Connection, secret: bytes) -> None:
    """Client side: answer the server's challenge and check its proof."""
    greeting = _receive_small(connection, len(_GREETING) + _CHALLENGE_BYTES)
    if not greeting.startswith(_GREETING):
        raise AuthenticationError("the pool's address answered with something that is not an nbscale pool")
    challenge = greeting[len(_GREETING) :]
    own_challenge = secrets.token_bytes(_CHALLENGE_BYTES)
    connection.send_bytes(_digest(secret, b"worker", challenge) + own_challenge)
    proof = _receive_small(connection, 64)
    if not hmac.compare_digest(proof, _digest(secret, b"kernel", own_challenge)):
        raise AuthenticationError("the kernel end of the pool failed authentication")


class Channel:
    """Sends and receives protocol messages; large buffers go through shared memory between local peers."""

    def __init__(self, connection: Connection, same_machine: bool = True) -> None:
        self.connection = connection
        self.same_machine = same_machine
        self._send_lock = threading.Lock()

    def reset_lock_after_fork(self) -> None:
        """In a child forked while another thread of the parent was sending: that thread's hold is not the child's."""
        self._send_lock = threading.Lock()

    def send(self, message: object) -> None:
        """Serialise and send one message (the receiver removes any shared-memory file)."""
        frame = serialise(message, keep=False)  # nothing here would release a kept file
        try:
            self.send_frame(frame, receiver_unlinks=True)
        except (OSError, ValueError):
            frame.release()  # the connection failed, so no receiver removes its files
            raise

    def send_frame(self, frame: Frame, receiver_unlinks: bool = False) -> None:
        """Send an already serialised frame (the same frame may go to many workers): large buffers as shared-memory
        files to a peer on this machine, on the socket to one elsewhere or when shared memory is full.

        Raises OSError or ValueError only when the connection fails.
        """
        shared = self.same_machine and frame.to_shared_memory()
        paths, sizes, kept = (frame.shm_paths, frame.shm_sizes, frame.shm_kept) if shared else ((), (), ())
        inline = [] if shared else frame.buffers
        inline_sizes = tuple(memoryview(buffer).nbytes for buffer in inline)  # so the peer reads each into place
        header = pickle.dumps((paths, sizes, kept, inline_sizes, receiver_unlinks, frame.label, frame.shm_failure))
        # whole or not at all: an interrupt part-way would leave the peer reading the next message as this one's rest.
        # The body goes on its own, not joined to the header: joining would copy it (a 2 GB return value, twice)
        with HeldInterrupt(), self._send_lock:
            self.connection.send_bytes(header)
            self.connection.send_bytes(frame.body)
            for buffer in inline:
                self.connection.send_bytes(buffer)

    def recv(self) -> Any:
        """Receive one message (blocks); raises EOFError when the peer has gone.

        Raises MessageUnreadable when the message arrived but cannot be unpickled here.
        """
        label: tuple[str, int | None, int | None]  # Frame.label: the message's kind, request_id and rank
        shm_paths, shm_sizes, shm_kept, inline_sizes, receiver_unlinks, label, shm_failure = pickle.loads(
            self.connection.recv_bytes()
        )
        mappings.release_removed()  # at every message: a dropped tensor's memory goes now, not at the next kept one
        if shm_failure is not None:  # the sender found shared memory full: the kernel says so once
            warn_shared_memory_failure(shm_failure)
        body = self.connection.recv_bytes()
        buffers: list[Any] = []
        unmappable: Exception | None = None
        if shm_paths:
            try:
                buffers = map_shared_memory(shm_paths, shm_sizes, shm_kept)
            except Exception as error:  # a file gone or unreadable: this message is lost, not the channel
                unmappable = error
            if receiver_unlinks:  # a kept tensor's file stays for later messages (nbscale.pool.resident)
                for path, kept in zip(shm_paths, shm_kept or (False,) * len(shm_paths), strict=True):
                    if not kept:
                        Path(path).unlink(missing_ok=True)
        for size in inline_sizes:  # straight into an aligned tensor's memory: no bytes object in between
            buffer = empty_bytes(size)
            self._receive_into(memoryview(buffer.numpy()))
            buffers.append(buffer)
        if unmappable is not None:
            raise MessageUnreadable(*label, unmappable)
        try:
            return deserialise(body, buffers)
        except Exception as error:  # any unpickling failure: a missing module, class or attribute
            raise MessageUnreadable(*label, error) from error

    def _receive_into(self, view: memoryview) -> None:
        """Read one message sent with `send_bytes` into `view`, which it must fill exactly. Connection's own
        recv_bytes_into reads the whole message into a BytesIO first and copies it over: twice the memory."""
        descriptor = self.connection.fileno()
        (size,) = struct.unpack("!i", _read_exactly(descriptor, 4))
        if size == -1:  # multiprocessing's framing of a message of 2 GiB or more
            (size,) = struct.unpack("!Q", _read_exactly(descriptor, 8))
        if size != view.nbytes:
            raise OSError(f"a buffer of {size} bytes arrived where {view.nbytes} were announced")
        view = view.cast("B")
        while view:
            count = os.readv(descriptor, [view])
            if count == 0:
                raise EOFError
            view = view[count:]

    def fileno(self) -> int:
        return self.connection.fileno()

    def close(self) -> None:
        try:
            self.connection.close()
        except OSError:
            pass


class ChannelListener:
    """The kernel's listening socket; `next_channel` returns only authenticated channels.

    Every connection is authenticated on a thread of its own, so a peer that connects and says nothing (or
    garbage) delays no worker; it is closed after at most HANDSHAKE_TIMEOUT_S and counted in `refused`.
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1") -> None:
        self._secret = secret
        self._socket = socket.create_server((host, 0), backlog=128)
        self._socket.settimeout(0.2)  # so the accept thread notices close()
        self.address: tuple[str, int] = self._socket.getsockname()[:2]
        self._ready: queue.Queue[Channel] = queue.Queue()
        self._handshakes = threading.BoundedSemaphore(MAX_CONCURRENT_HANDSHAKES)
        self._lock = threading.Lock()
        self._closed = False
        self.refused: list[str] = []  # why each refused peer was refused
        threading.Thread(target=self._accept_forever, name="nbscale-pool-listener", daemon=True).start()

    def next_channel(self, timeout: float) -> Channel:
        """The next authenticated channel; raises TimeoutError when none arrives within `timeout` s."""
        try:
            return self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def _accept_forever(self) -> None:
        while not self._closed:
            try:
                peer, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            if not self._handshakes.acquire(blocking=False):
                peer.close()
                self._refuse(f"more than {MAX_CONCURRENT_HANDSHAKES} connections were handshaking at once")
                continue
            threading.Thread(target=self._handshake, args=(peer,), name="nbscale-pool-handshake", daemon=True).start()

    def _handshake(self, peer: socket.socket) -> None:
        try:
            peer.settimeout(None)
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection(peer.detach())
            try:
                authenticate_client(connection, self._secret)
            except (AuthenticationError, OSError, EOFError) as error:
                connection.close()
                self._refuse(str(error) or type(error).__name__)
                return
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._ready.put(Channel(connection))
        finally:
            self._handshakes.release()

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.refused.append(reason)

    def close(self) -> None:
        """Stop listening; channels not yet taken with `next_channel` are closed."""
        with self._lock:
            self._closed = True
        self._socket.close()
        while not self._ready.empty():
            self._ready.get_nowait().close()


def connect(address: tuple[str, int], secret: bytes, timeout: float = 30.0) -> Channel:
    """Connect to a pool's kernel end and authenticate both ways."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connection = Connection(sock.detach())
    authenticate_server(connection, secret)
    return Channel(connection)
