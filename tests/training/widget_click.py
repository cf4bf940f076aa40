"""Click a widget button in a running cell the way a browser does: a comm_msg on the shell channel."""

from __future__ import annotations

import time
from typing import Any

from tests.kernel_session import CellResult, KernelSession

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def run_and_click(kernel: KernelSession, code: str, click_after: float, timeout: float = 120) -> CellResult:
    """Run `code`; `click_after` seconds after its first widget appears, click that widget."""
    result = CellResult()
    client = kernel.client
    message_id = client.execute(code)
    deadline = time.monotonic() + timeout
    widget_id: str | None = None
    click_at: float | None = None
    while time.monotonic() < deadline:
        if click_at is not None and time.monotonic() >= click_at and widget_id is not None:
            content = {"comm_id": widget_id, "data": {"method": "custom", "content": {"event": "click"}}}
            client.shell_channel.send(client.session.msg("comm_msg", content))
            click_at = None
        try:
            message: dict[str, Any] = client.get_iopub_msg(timeout=0.1)
        except Exception:
            continue
        if message["parent_header"].get("msg_id") != message_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return result
        if kind == "stream":
            setattr(result, content["name"], getattr(result, content["name"]) + content["text"])
        elif kind in ("display_data", "update_display_data", "execute_result"):
            result.displays.append(content["data"])
            if widget_id is None and WIDGET_VIEW in content["data"]:
                widget_id = content["data"][WIDGET_VIEW]["model_id"]
                click_at = time.monotonic() + click_after
        elif kind == "error":
            result.error_name, result.error_value = content["ename"], content["evalue"]
            result.traceback = "\n".join(content["traceback"])
    raise TimeoutError(f"cell did not finish in {timeout} s")
