"""Widget clicks handled while a cell still runs: the comm's messages go to a kernel subshell (ipykernel >= 7.4).

A running cell blocks the kernel's main thread, so a widget's messages (a Stop button's click) wait until it
ends. ipykernel 7 has subshells (JEP 91), each with its own thread, and ipykernel 7.4 routes a comm's incoming
messages to the subshell named by the comm's `_reply_subshell_id`. So: ask the kernel for a subshell with a
`create_subshell_request` on its own control channel (the public protocol, from a client in this process), and
point the widgets' comms at it. `_reply_subshell_id` is ipykernel's private attribute: tests/ui/test_click_routing.py
fails when ipykernel changes it. The routing is used only where it works (ipykernel >= 7.4, found at run time);
anywhere else (an older ipykernel, another kernel, no kernel) nothing is routed and the caller is told so (the
Stop button then says to interrupt the kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ipykernel.kernelbase import Kernel

SUBSHELLS = "kernel subshells"  # the kernel_info feature that names subshell support (JEP 91)


def route_clicks_off_main_thread(*widgets: Any) -> Callable[[], None] | None:
    """Have the widgets' messages handled in a new subshell while the cell runs; returns an undo function
    (it deletes the subshell), or None where clicks can only be handled after the cell."""
    kernel = _kernel()
    comms = [widget.comm for widget in widgets if getattr(widget, "comm", None) is not None]
    if kernel is None or not comms or not routes_comms_to_subshells(kernel):
        return None
    try:
        client = _control_client()
    except Exception:  # no connection file (an embedded kernel): nothing to route through
        return None
    try:
        subshell_id = _request(client, "create_subshell_request", {}).get("subshell_id")
    except Exception:
        client.stop_channels()
        return None
    if not subshell_id:
        client.stop_channels()
        return None
    for comm in comms:
        comm._reply_subshell_id = subshell_id  # read by ipykernel >= 7.4 for every incoming comm message

    def undo() -> None:
        for comm in comms:
            comm._reply_subshell_id = None
        try:
            _request(client, "delete_subshell_request", {"subshell_id": subshell_id})
        except Exception:  # the kernel is shutting down: its subshells go with it
            pass
        finally:
            client.stop_channels()

    return undo


def displayed_and_routed(widget: Any) -> tuple[Any, Callable[[], None] | None]:
    """Display `widget` with its messages already routed (route_clicks_off_main_thread): its display handle and the
    undo function. Routed before its view exists, so the view's first message (its `_view_count`, which tells the
    kernel that widgets draw here: nbscale.ui.widget_front_end) reaches the subshell: a route set after the display
    lost the race to a quick browser on a busy kernel, and the message then waited for the cell's end. The route
    is set again after the display, since sending from the main thread resets it (keep_routed)."""
    from IPython.display import display

    undo = route_clicks_off_main_thread(widget)
    subshell = routed_to(widget)
    handle = display(widget, display_id=True)
    keep_routed(widget, subshell)
    return handle, undo


def can_route_clicks() -> bool:
    """Whether this process's kernel can handle widget messages while a cell runs (asked before making a widget
    that would be of no use otherwise)."""
    kernel = _kernel()
    return kernel is not None and routes_comms_to_subshells(kernel)


def routes_comms_to_subshells(kernel: Kernel) -> bool:
    """True where `kernel` has subshells and routes a comm's messages to one (ipykernel 7.4 and later)."""
    if SUBSHELLS not in kernel.kernel_info.get("supported_features", []):
        return False
    try:
        from ipykernel import version_info
    except ImportError:  # a kernel that is not ipykernel but says it has subshells
        return False
    return tuple(version_info[:2]) >= (7, 4)


def _kernel() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


def _control_client() -> Any:
    """A client of this kernel's control channel, from its connection file."""
    from ipykernel.connect import get_connection_info
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient()
    # unpack=True gives the dict (typed as str | dict), and load_connection_info takes it (typed as a TypedDict)
    client.load_connection_info(get_connection_info(unpack=True))  # type: ignore[arg-type]
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    return client


def _request(client: Any, kind: str, content: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send a control request and return its reply's content (the control thread answers at once)."""
    message = client.session.msg(kind, content)
    client.control_channel.send(message)
    while True:
        reply = client.control_channel.get_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
            if reply["content"].get("status", "ok") != "ok":
                raise RuntimeError(reply["content"].get("evalue", f"{kind} failed"))
            return cast("dict[str, Any]", reply["content"])


def routed_to(widget: Any) -> str | None:
    """The subshell `widget`'s incoming messages go to (None: the main thread's shell)."""
    return getattr(getattr(widget, "comm", None), "_reply_subshell_id", None)


def keep_routed(widget: Any, subshell_id: str | None) -> None:
    """Route `widget`'s messages to `subshell_id` again after the main thread sent on its comm: ipykernel 7.4 sends
    a comm's incoming messages to the subshell that last sent on it, and the main thread's is none."""
    comm = getattr(widget, "comm", None)
    if subshell_id is not None and comm is not None:
        comm._reply_subshell_id = subshell_id
