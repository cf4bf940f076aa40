"""A real IPython kernel for tests: execute cells and read what a user would see in the notebook."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

REPO_ROOT = Path(__file__).resolve().parent.parent
CLOSE_POOL = "import nbscale\np = nbscale.current_pool(start=False)\nif p is not None: p.close()"


def handles_clicks_mid_cell() -> bool:
    """Whether this venv's ipykernel runs a widget's click while a cell runs (subshells routed: ipykernel >= 7.4,
    as nbscale.ui.click_routing finds it); older ones run it after the cell, and the Stop button is the documented
    fallback, "Stop: interrupt the kernel"."""
    import ipykernel

    return tuple(int(part) for part in ipykernel.__version__.split(".")[:2]) >= (7, 4)


def needs_clicks_mid_cell(test: Any) -> Any:
    """Mark a test that clicks a widget while its cell runs: skipped where ipykernel cannot (below 7.4, the floor
    6.29 of `make test-oldest`), whose fallback tests/ui/test_click_routing.py's
    test_the_stop_button_a_kernel_shows_is_the_one_its_ipykernel_can_run checks there instead."""
    import pytest

    reason = "ipykernel < 7.4 runs a click after the cell: its Stop button is the interrupt fallback, tested apart"
    return pytest.mark.skipif(not handles_clicks_mid_cell(), reason=reason)(test)


def cell_name(number: int | None = None) -> str:
    """A regex of the name IPython gives notebook cell `number` (any cell when None) in a traceback: "Cell In[4]"
    under IPython 8+; under IPython 7.34 (Colab's, the floor) the kernel's file of the cell, as IPython 7 names it
    (nbscale.cell_names)."""
    import IPython

    if IPython.version_info >= (8,):
        return r"Cell In\[" + (str(number) if number is not None else r"\d+") + r"\]"
    return r"/\S*ipykernel_\d+/\d+\.py"


@dataclass
class CellResult:
    """What one executed cell showed: streams, rich outputs, and the error if it failed."""

    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    shown_at: list[float] = field(default_factory=list)  # when the kernel sent each of `displays` (its clock, in s)
    widget_states: list[dict[str, Any]] = field(default_factory=list)  # each widget's state opened or updated
    error_name: str | None = None
    error_value: str | None = None
    traceback: str = ""
    stdout_messages: int = 0  # how many stream messages carried `stdout`
    sequence: list[str] = field(default_factory=list)  # streams and displays in the order sent: "stdout: ...", ...

    @property
    def ok(self) -> bool:
        return self.error_name is None

    @property
    def text(self) -> str:
        """Everything shown as text: streams, plain-text reprs, and the error lines."""
        plain = [d.get("text/plain", "") for d in self.displays]
        return "\n".join([self.stdout, self.stderr, *plain, self.traceback])


class IpcKernelManager(KernelManager):
    """A python3 KernelManager whose kernel talks over Unix sockets in a fresh private folder: TCP ports picked free
    can be taken by a parallel test's kernel before this one binds them ("Address already in use", the kernel dies
    before kernel_info); socket files in a folder of its own cannot. The folder goes with the kernel's resources."""

    def __init__(self) -> None:
        self.socket_folder = tempfile.mkdtemp(prefix="nbk-")
        super().__init__(kernel_name="python3", transport="ipc", ip=os.path.join(self.socket_folder, "k"))

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        """Fork the kernel from this test process's launcher (tests/kernel_launcher.py) where it can, else start it
        as jupyter_client does."""
        from tests.kernel_launcher import LAUNCHER

        provisioner = self.provisioner
        assert provisioner is not None
        forked = LAUNCHER.fork(kernel_cmd, kw.get("env") or os.environ, str(kw.get("cwd") or os.getcwd()))
        if forked is None:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        provisioner.process = forked  # type: ignore[attr-defined]  # a Popen's methods, which it uses
        provisioner.pid = provisioner.pgid = forked.pid  # type: ignore[attr-defined]  # its own session
        provisioner.cwd = kw.get("cwd")  # type: ignore[attr-defined]
        self._reconcile_connection_info(provisioner.connection_info)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self.socket_folder, ignore_errors=True)


class KernelSession:
    """A live python3 kernel started with this interpreter; `run(code)` returns a CellResult."""

    def __init__(self, cwd: Path | None = None, env: dict[str, str] | None = None, python: str | None = None) -> None:
        self.manager = IpcKernelManager()
        kernel_env = {**os.environ, **(env or {})}
        self.manager.kernel_spec.argv[0] = python or sys.executable
        self.manager.start_kernel(cwd=str(cwd or REPO_ROOT), env=kernel_env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid  # type: ignore[union-attr]

    def run(
        self,
        code: str,
        timeout: float = 120,
        interrupt_after: float | Sequence[float] | None = None,
        interrupt_when: Callable[[], bool] | None = None,
    ) -> CellResult:
        """Execute `code` as one cell; with `interrupt_after`, interrupt the kernel that many seconds in (a sequence:
        at each of those times, while the cell runs); with `interrupt_when`, once, as soon as it returns True
        (asked every 50 ms while the cell runs), so the interrupt lands at an event rather than at a time a busy
        machine may not keep."""
        while True:
            message_id, result = self._execute(code, timeout, interrupt_after, interrupt_when)
            # ipykernel 6 (the floor) aborts, unrun, an execute request that arrives in the moment after a cell
            # failed (its stop_on_error window); a user's next run comes later, so the cell is sent again
            if not self._aborted(message_id):
                return result

    def _aborted(self, message_id: str) -> bool:
        """Whether the kernel's reply to request `message_id` says it aborted the request without running it."""
        while True:
            reply = self.client.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == message_id:
                return bool(reply["content"]["status"] == "aborted")

    def _execute(
        self,
        code: str,
        timeout: float,
        interrupt_after: float | Sequence[float] | None,
        interrupt_when: Callable[[], bool] | None,
    ) -> tuple[str, CellResult]:
        result = CellResult()

        def collect(message: dict[str, Any]) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                result.sequence.append(f"{content['name']}: {content['text']}")
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                    result.stdout_messages += 1
                else:
                    result.stderr += content["text"]
            elif kind in ("display_data", "execute_result", "update_display_data"):
                result.displays.append(content["data"])
                result.sequence.append(f"{kind}: {content['data'].get('text/plain', '')}")
                result.shown_at.append(_sent_at(message))
            elif kind in ("comm_open", "comm_msg") and "state" in content.get("data", {}):
                result.widget_states.append(content["data"]["state"])
            elif kind == "error":  # the last error names the cell's failure; every error's lines are kept
                result.error_name, result.error_value = content["ename"], content["evalue"]
                result.traceback += "\n".join(content["traceback"]) + "\n"

        message_id = self.client.execute(code)
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        times = [interrupt_after] if isinstance(interrupt_after, int | float) else list(interrupt_after or [])
        interrupts = sorted(started + after for after in times)
        while True:
            if interrupts and time.monotonic() >= interrupts[0]:
                self.manager.interrupt_kernel()
                interrupts.pop(0)
            if interrupt_when is not None and interrupt_when():
                self.manager.interrupt_kernel()
                interrupt_when = None
            if time.monotonic() > deadline:
                # a cell left running (a training, a wait) would go on using the CPU for the rest of the suite, and
                # the fixture's clean-up cell would queue behind it: stop it as the user would
                self.manager.interrupt_kernel()
                raise TimeoutError(f"cell did not finish in {timeout} s:\n{code}\n--- so far:\n{result.text}")
            try:
                message = self.client.get_iopub_msg(timeout=0.2 if interrupt_when is None else 0.05)
            except Exception:  # queue.Empty
                continue
            if message["parent_header"].get("msg_id") != message_id:
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                return message_id, result
            collect(message)

    def child_running(self, module: str) -> bool:
        """Whether a process the kernel started (at any depth) runs `python -m module`."""
        import psutil

        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return False
        for child in children:
            try:
                if module in child.cmdline():
                    return True
            except psutil.Error:
                continue
        return False

    def forkserver_running(self) -> bool:
        """Whether a pool's forkserver the kernel started runs: its pool has begun to start."""
        from tests.pool_processes import forkservers_of

        return bool(forkservers_of(self.pid))

    def kill(self) -> None:
        """Kill the kernel process abruptly (as a crash would), without any cleanup of its own."""
        os.kill(self.pid, signal.SIGKILL)
        self.manager.cleanup_resources()

    def shutdown(self) -> None:
        self.client.stop_channels()
        if self.manager.is_alive():
            self.manager.shutdown_kernel(now=True)

    def close(self, clean_up: str = CLOSE_POOL, timeout: float = 30) -> None:
        """Run `clean_up` (by default: close the kernel's pool, as a user would), then shut the kernel down, even
        where the clean-up cell fails or times out: a kernel left behind runs on for the rest of the suite."""
        try:
            self.run(clean_up, timeout=timeout)
        finally:
            self.shutdown()


@contextmanager
def kernel_after(setup: str) -> Iterator[KernelSession]:
    """A real kernel that ran `setup` (which must succeed), shut down on leaving: a module's shared kernel."""
    session = KernelSession()
    try:
        result = session.run(setup)
        assert result.ok, result.text
        yield session
    finally:
        session.shutdown()


def _sent_at(message: dict[str, Any]) -> float:
    """When the kernel sent `message` (its header's date), in seconds since the epoch."""
    from datetime import datetime

    date = message["header"]["date"]
    return (date if isinstance(date, datetime) else datetime.fromisoformat(str(date))).timestamp()


def run_notebook(path: Path, timeout: int = 600, cwd: Path | None = None) -> Any:
    """Execute a notebook file with nbclient in a real kernel and return the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        km=IpcKernelManager(),
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or path.parent)}},
    )
    client.execute()
    return notebook


def printed_text(notebook: Any) -> str:
    """Everything an executed notebook's cells printed or showed as text, in order."""
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(texts)
