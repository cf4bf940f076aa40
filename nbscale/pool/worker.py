"""A pool worker: connects to the kernel, joins the torch.distributed group, and serves requests.

Two threads, each a dispatch table over the protocol's message types: the receiver thread reads the channel and
handles what must work while the worker is busy (Interrupt, RequestStop, StatusQuery, Shutdown, the kernel going
away) and queues the rest; the main thread runs the queued requests one at a time.
Run standalone as `python -m nbscale.pool.worker` with a WorkerConfig's JSON line on stdin (the cluster backend),
or forked from the local forkserver, which calls `serve(config)`.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C functions: getsignal without the enum lookup
import importlib
import json
import linecache
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil
import torch
import torch.distributed as dist

from nbscale.errors import UnsendableError
from nbscale.pool import mappings
from nbscale.pool import protocol as p
from nbscale.pool.channel import Channel, MessageUnreadable, connect, machine_id
from nbscale.pool.collectives import Collectives, current_collective, new_request
from nbscale.pool.context import WorkerContext, set_worker_context
from nbscale.pool.folders import ImportableFolder, current_folder, enter_folder
from nbscale.pool.interrupts import (
    HeldInterrupt,
    RequestGate,
    hold_every_interrupt,
    interrupt_main_thread,
    set_task_cancelled,
)
from nbscale.pool.matlab_names import note_matlab_name
from nbscale.pool.orphans import exit_with_parent
from nbscale.pool.references import CompositeReference, ModuleReference
from nbscale.pool.resident import keep_tensors_here
from nbscale.pool.sealed import hold_pool_key
from nbscale.pool.stall_spots import describe_spot, idle_between, thread_activity
from nbscale.pool.transport import announce_failures_here
from nbscale.pool.worker_output import StreamToKernel, user_traceback

if TYPE_CHECKING:
    import types


class Worker:
    """The state of one worker process and its request handlers."""

    def __init__(self, channel: Channel, config: p.WorkerConfig) -> None:
        self.channel = channel
        self.pid = os.getpid()  # a process the user's code forks runs this code too, under another pid
        self.rank = config.rank
        self.world_size = config.world_size
        self.device = torch.device(config.device)
        self.home = current_folder() or "/"  # where a request runs whose notebook folder does not exist here
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.busy = False
        self.interruptible = False  # whether the main thread runs a request's code (SIGINT raises only then)
        self._gate = RequestGate(lambda: self.interruptible)  # the one SIGINT handler installed (interrupts.py)
        self.current_request: int | None = None  # the request the main thread runs (None between requests)
        # the main thread's last seen spot and activity, and since when it has stood still there
        self._spot: tuple[tuple[int, int], tuple[int, int] | None, float] | None = None
        self._cell_file: str | None = None  # the file name of the last spmd cell run: its code says "the cell"
        # (ident, native id) of the thread that runs the requests, set by `serve`: in a forked worker
        # threading.main_thread().native_id is still the forking thread's (Python 3.11 does not reset it)
        self._serving_thread: tuple[int, int] | None = None
        self.cancelled_requests: set[int] = set()  # pool.cancel() reached them, maybe before they started
        # messages to a request this worker has not started yet (a peer ran ahead), and the requests that ended
        self.early_messages: dict[int, list[Any]] = {}
        self.ended_requests: deque[int] = deque(maxlen=256)
        self.request_lock = threading.Lock()  # current_request vs a targeted Interrupt
        self.groups: dict[tuple[int, ...], Any] = {}
        self.context = WorkerContext(self.rank, self.world_size, self.device, socket.gethostname(), self._emit)
        set_worker_context(self.context)
        self.namespace: dict[str, Any] = {"__name__": "__spmd__", "torch": torch}
        # requests, run one at a time on the main thread
        self.handlers: dict[type, Callable[[Any], Any]] = {
            p.InitGroup: self.init_group,
            p.MakeGroup: self.make_group,
            p.RunCell: self.run_cell,
            p.Call: self.call,
            p.Push: self.push,
            p.Pull: self.pull,
        }
        # control messages, handled on the receiver thread at once, even while a request runs
        self.urgent: dict[type, Callable[[Any], None]] = {
            p.Interrupt: self.interrupt,
            p.RequestStop: self.request_stop,
            p.RequestMessage: self.deliver_message,
            p.StatusQuery: self.report_status,
            p.Shutdown: self.shut_down,
            p.NotebookFolder: self.follow_notebook_folder,
        }
        self.importable_folder = ImportableFolder()

    # ---- receiver thread ------------------------------------------------------------------------------------

    def receive_forever(self) -> None:
        """Read the channel; exit the process when the kernel goes away."""
        while True:
            try:
                message = self.channel.recv()
            except MessageUnreadable as unreadable:
                self._refuse(unreadable)
                continue
            except (EOFError, OSError):
                mappings.remove_if_kernel_ended()  # a killed kernel's kept files go with it
                os._exit(0)
            handle = self.urgent.get(type(message))
            if handle is not None:
                handle(message)
            else:
                self.busy = True  # set here so an Interrupt right after the request finds it busy
                self.inbox.put(message)
            del message  # not held while the next is read and mapped (pool/mappings.py)

    def interrupt(self, message: p.Interrupt) -> None:
        """KeyboardInterrupt in the main thread: for one request (pool.cancel), or whatever runs."""
        if message.request_id is not None:
            with self.request_lock:
                self.cancelled_requests.add(message.request_id)
                if self.current_request == message.request_id:
                    set_task_cancelled(True)  # a cancel, not the user's interrupt: see interrupts.task_cancelled
                    interrupt_main_thread()
        elif self.busy:
            interrupt_main_thread()

    def follow_notebook_folder(self, message: p.NotebookFolder) -> None:
        self.importable_folder.follow(message.folder)

    def request_stop(self, message: p.RequestStop) -> None:
        self.context.request_stop()

    def deliver_message(self, message: p.RequestMessage) -> None:
        """A message to a running request: kept for its code (until it starts here, when a peer running it sent
        what the notebook answers), or dropped once the request ended."""
        with self.request_lock:
            if self.current_request == message.request_id:
                self.context.deliver_message(message.payload)
            elif message.request_id not in self.ended_requests:
                self.early_messages.setdefault(message.request_id, []).append(message.payload)

    def report_status(self, message: p.StatusQuery) -> None:
        """Answer the heartbeat: memory, and where the main thread is and for how long it has not moved."""
        collective = current_collective() if self.current_request is not None else ""
        self.channel.send(
            p.StatusReport(message.request_id, self.rank, *self._memory(), *self._main_thread_spot(), collective)
        )

    def _main_thread_spot(self) -> tuple[str, float]:
        """Where the main thread is, and for how long it has stood still there: at the same instruction, and (where
        /proc tells) without CPU time or wake-ups in between. A loop that sleeps or waits briefly at one line each
        round is seen at the same instruction every time, but wakes up: that counts as moving."""
        serving = self._serving_thread
        frame = (
            sys._current_frames().get(serving[0]) if serving is not None and self.current_request is not None else None
        )
        if serving is None or frame is None:
            self._spot = None
            return "", 0.0
        spot, activity, now = (id(frame), frame.f_lasti), thread_activity(serving[1]), time.monotonic()
        still = (
            self._spot is not None
            and self._spot[0] == spot
            and (activity is None or self._spot[1] is None or idle_between(self._spot[1], activity))
        )
        self._spot = (spot, activity, self._spot[2] if still and self._spot is not None else now)
        return describe_spot(frame, self._cell_file), now - self._spot[2]

    def shut_down(self, message: p.Shutdown) -> None:
        os._exit(0)

    def _refuse(self, unreadable: MessageUnreadable) -> None:
        """Fail a request this worker cannot unpickle (the kernel would otherwise wait for it forever)."""
        if unreadable.request_id is None:
            return
        self.channel.send(
            p.Failed(
                unreadable.request_id,
                self.rank,
                type(unreadable.error).__name__,
                f"worker {self.rank} could not read what it was sent ({unreadable}). Code and values sent to workers "
                "must be importable there: a module from a folder added to sys.path where the pool was started needs "
                "that folder on the workers' sys.path too (add it with pool.run or a %%spmd cell), or define the code "
                "in the cell.",
                "",
            )
        )

    def _memory(self) -> tuple[float, float | None]:
        memory_mb = psutil.Process().memory_info().rss / 2**20
        device_mb = None
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            device_mb = torch.cuda.memory_reserved(self.device) / 2**20
        return memory_mb, device_mb

    # ---- main thread ----------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run requests one by one; every request ends in Done or Failed."""
        self._serving_thread = (threading.get_ident(), threading.get_native_id())
        signal.signal(signal.SIGINT, self._gate)
        while True:
            try:
                message = self.inbox.get()
            except KeyboardInterrupt:  # an interrupt that arrived just after the last request ended
                continue
            self.context.reset()
            new_request()  # collectives counted per request, for the kernel's mismatch check
            if _signal.getsignal(signal.SIGINT) is not self._gate:  # a cell installed its own handler and left it
                signal.signal(signal.SIGINT, self._gate)
            reply = self._answer(message)
            with self.request_lock:
                self.current_request = None
                self.ended_requests.append(message.request_id)
                self.early_messages.pop(message.request_id, None)
                set_task_cancelled(False)
            self.busy = not self.inbox.empty()
            try:
                self._send_reply(reply)
            except Exception as error:  # the value could not be pickled: say so instead of hanging
                failure = f"the result could not be sent back: {error}"
                self.channel.send(p.Failed(message.request_id, self.rank, type(error).__name__, failure, ""))
            # not held while waiting for the next: its values would pin the kept files' mappings (pool/mappings.py)
            del message, reply

    def _answer(self, message: Any) -> p.Done | p.Failed:
        """Run one request: its Done, or its Failed for any exception (an interrupt included)."""
        try:  # a targeted Interrupt lands inside this try from the moment current_request names the request
            with self.request_lock:
                self.current_request = message.request_id
                for payload in self.early_messages.pop(message.request_id, []):
                    self.context.deliver_message(payload)
                cancelled = message.request_id in self.cancelled_requests
                self.cancelled_requests.discard(message.request_id)
                # opened with current_request, under the lock a targeted Interrupt takes: one finding the request
                # current must find the gate open too (opened later, its SIGINT could land first and be dropped)
                self.interruptible = True
            try:
                if cancelled:
                    raise KeyboardInterrupt("cancelled before it started")
                value = self.handlers[type(message)](message)
            finally:
                self.interruptible = False
            if os.getpid() != self.pid:
                _end_forked_copy(None)
            sys.stdout.flush()
            sys.stderr.flush()
            return p.Done(message.request_id, self.rank, value)
        except BaseException as error:  # every failure goes back to the kernel
            self.interruptible = False  # (an interrupt landing just after the gate opened skipped the finally)
            if os.getpid() != self.pid:
                _end_forked_copy(error)
            sys.stdout.flush()
            sys.stderr.flush()
            held = (
                tuple(name for name in message.result_names if name in self.namespace)
                if isinstance(message, p.RunCell)
                else ()
            )
            origin = (type(error).__module__, type(error).__qualname__)
            return p.Failed(
                message.request_id, self.rank, type(error).__name__, str(error), user_traceback(error), origin, held
            )

    def _send_reply(self, reply: object) -> None:
        """Send the reply, whole, even if a late interrupt (meant for the request that just ended) comes meanwhile."""
        try:
            with HeldInterrupt():
                self.channel.send(reply)
        except KeyboardInterrupt:
            pass

    def _emit(self, payload: object) -> None:
        if self.current_request is not None:
            self.channel.send(p.Event(self.current_request, self.rank, payload))

    def init_group(self, message: p.InitGroup) -> None:
        store: dist.Store
        if message.store_file is not None:  # a local pool: a private file, not a port any local user can reach
            store = dist.FileStore(message.store_file, message.world_size)
        elif self.rank == 0:  # a cluster's store listens on master_addr only, not on every interface
            listening = _listen_on(message.master_addr)
            store = dist.TCPStore(
                message.master_addr,
                listening.getsockname()[1],
                message.world_size,
                is_master=True,
                wait_for_workers=False,
                master_listen_fd=listening.detach(),
            )
            self._emit({"store_port": store.port})
        else:
            store = dist.TCPStore(message.master_addr, message.master_port, message.world_size, is_master=False)
        options: dict[str, Any] = {}
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            options["device_id"] = self.device
        dist.init_process_group(message.backend, store=store, rank=self.rank, world_size=message.world_size, **options)
        self.namespace.update(self._cell_names(None))

    def make_group(self, message: p.MakeGroup) -> None:
        self.groups[message.ranks] = dist.new_group(list(message.ranks))

    def _cell_names(self, group_ranks: tuple[int, ...] | None) -> dict[str, Any]:
        if group_ranks is None:
            collectives = Collectives()
        else:
            collectives = Collectives(self.groups[group_ranks], group_ranks)
        return {"rank": self.rank, "world_size": self.world_size, "device": self.device, **collectives.helpers()}

    def _bind(self, variables: dict[str, Any]) -> None:
        for name, value in variables.items():
            if isinstance(value, ModuleReference):
                self.namespace[name] = self._import(name, value.module)
            else:
                self.namespace[name] = self._own(value)

    def _import(self, name: str, module: str) -> types.ModuleType:
        """The notebook's module variable `name`, imported here by its name; UnsendableError naming the variable when
        it cannot be (a module made in the notebook, or one only the kernel's folders hold)."""
        try:
            return importlib.import_module(module)
        except Exception as error:
            raise UnsendableError(
                f"Variable {name!r} is the module {module!r}, which worker {self.rank} cannot import "
                f"({type(error).__name__}: {error}). Modules are not sent but imported again on each worker by name: "
                "make it importable there (install it, or add its folder to sys.path in a %%spmd cell), or build "
                "what the cell needs inside the cell."
            ) from None

    def _own(self, value: object) -> object:
        """This worker's own value of a Composite the notebook passed (a CompositeReference); others unchanged."""
        if not isinstance(value, CompositeReference):
            return value
        if value.key not in self.namespace:
            raise NameError(f"this worker has no value for Composite {value.key!r}")
        return self.namespace[value.key]

    def _enter_notebook_folder(self, message: p.RunCell | p.Call) -> None:
        """Run in the notebook's folder of the request (as MATLAB's workers do), or say why it cannot."""
        reason = enter_folder(message.cwd, self.home)
        if reason is not None and message.cwd is not None:
            self.channel.send(
                p.FolderMissing(message.request_id, self.rank, socket.gethostname(), message.cwd, reason, self.home)
            )

    def run_cell(self, message: p.RunCell) -> list[str]:
        self._enter_notebook_folder(message)
        self._bind(message.variables)
        self.namespace.update(self._cell_names(message.group_ranks))
        lines = message.code.splitlines(keepends=True)
        linecache.cache[message.filename] = (len(message.code), None, lines, message.filename)
        self._cell_file = message.filename
        try:
            exec(compile(message.code, message.filename, "exec"), self.namespace)
        except NameError as error:
            note_matlab_name(error)
            raise
        finally:
            self.context.cell_ended()
        return [name for name in message.result_names if name in self.namespace]

    def call(self, message: p.Call) -> Any:
        self._enter_notebook_folder(message)
        args = [self._own(a) for a in message.args]
        return message.function(*args, **{key: self._own(value) for key, value in message.kwargs.items()})

    def push(self, message: p.Push) -> None:
        self._bind(message.variables)

    def pull(self, message: p.Pull) -> dict[str, Any]:
        missing = [name for name in message.names if name not in self.namespace]
        if missing:
            raise NameError(f"no variable named {', '.join(map(repr, missing))} on this worker")
        return {name: self.namespace[name] for name in message.names}


def _end_forked_copy(error: BaseException | None) -> None:
    """Exit a process that the user's code forked and that ran on to the end of the request (never returns).

    Only the worker answers the kernel: a forked copy that replied or served on would take the worker's replies
    and leave the worker waiting for it (`os.waitpid`) forever. The copy exits as a script's process would at its
    end: 0, `sys.exit`'s code, or 1 with the traceback on its stderr (shown in the notebook under the rank).
    """
    code = 0
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    elif error is not None:
        sys.stderr.write(f"A process forked by this worker (pid {os.getpid()}) failed:\n{user_traceback(error)}")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _forget_parent_after_fork(channel: Channel, streams: tuple[StreamToKernel, ...]) -> None:
    """In a child the user's code forked: its output still reaches the notebook, on locks of its own."""
    channel.reset_lock_after_fork()
    for stream in streams:
        stream.forget_parent_after_fork()


def _listen_on(host: str) -> socket.socket:
    """A listening socket on `host` (a free port), for torch.distributed's store to take over."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listening = socket.socket(family, kind, protocol)
    listening.bind(address)
    listening.listen(socket.SOMAXCONN)
    return listening


def serve(config: p.WorkerConfig) -> None:
    """Connect, say hello, and serve until the kernel goes away (never returns normally)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    announce_failures_here(False)  # a full /dev/shm is said once, by the kernel, not by every worker
    keep_tensors_here(False)  # a reply's files are the kernel's to remove once read (nbscale.pool.resident)
    hold_every_interrupt()
    channel = connect(config.kernel_address, bytes.fromhex(config.secret))
    hold_pool_key(bytes.fromhex(config.secret))  # for the peers' pickles in collectives (nbscale.pool.sealed)
    channel.same_machine = config.kernel_machine_id == machine_id()
    worker = Worker(channel, config)
    streams = (StreamToKernel(channel, worker.rank, "stdout"), StreamToKernel(channel, worker.rank, "stderr"))
    sys.stdout, sys.stderr = streams
    os.register_at_fork(after_in_child=lambda: _forget_parent_after_fork(channel, streams))
    channel.send(p.Hello(worker.rank, os.getpid(), socket.gethostname(), str(worker.device), machine_id()))
    threading.Thread(target=worker.receive_forever, name="nbscale-receiver", daemon=True).start()
    try:
        worker.serve()
    finally:
        os._exit(0)


def main() -> None:
    """Entry point for `python -m nbscale.pool.worker` (config as one JSON line on stdin)."""
    exit_with_parent("nbscale-watch-launcher")  # a lost Ray actor or node takes its worker along
    # A Ray actor runs with SIGINT blocked, and a child inherits its signal mask: unblocked, an Interrupt (kernel
    # interrupt, pool.cancel) raises KeyboardInterrupt here as in a forked worker, instead of forcing a restart.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = p.WorkerConfig.from_json(json.loads(sys.stdin.readline()))
    os.environ.update(config.env)
    serve(config)


if __name__ == "__main__":
    main()
