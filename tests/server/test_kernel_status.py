"""The server extension keeps the kernel's status true while a training cell runs: the widget messages a subshell
handles mid-cell (a click, a live figure's "ready") and the subshell requests are untracked message types, and the
kernels this server starts are told so, which turns the browser-drawn live figure on (nbscale.ui.widget_front_end).
tests/labextension checks the status bar itself, in Chromium."""

from __future__ import annotations

import os

from nbscale.lab_extension import STATUS_KEPT_VARIABLE
from nbscale.server import UNTRACKED_MESSAGE_TYPES


async def test_widget_and_subshell_messages_are_untracked_and_the_servers_kernels_draw_live_figures(jp_serverapp):
    kernels = jp_serverapp.kernel_manager
    assert {"comm_msg", "create_subshell_request", "create_subshell_reply"} <= set(UNTRACKED_MESSAGE_TYPES)
    assert set(UNTRACKED_MESSAGE_TYPES) <= set(kernels.untracked_message_types)
    assert kernels.track_message_type("execute_request")  # a cell still counts as the user's activity
    assert os.environ[STATUS_KEPT_VARIABLE] == "1"

    kernel_id = await kernels.start_kernel()
    client = kernels.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        printed: list[str] = []

        def keep_stream(message: dict) -> None:
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])

        code = "from nbscale.ui import widget_front_end; print(widget_front_end.ASKED.is_set())"
        reply = await client.execute_interactive(code, output_hook=keep_stream, timeout=120)
        assert reply["content"]["status"] == "ok"
        assert "".join(printed).strip() == "True"
    finally:
        client.stop_channels()
        await kernels.shutdown_kernel(kernel_id, now=True)
