"""The live figure drawn in the browser (issue 42): in a real kernel told that its front end draws widgets, the
figure's display holds the widget beside a PNG, each tick sends the widget only the points added since the last
(small messages that do not grow with the run, every loss exactly once), a view's "ready" brings every point
once, and the run's end leaves the final PNG alone in the display. Without a widget front end the PNG clock
stays (tests/ui/test_live_display.py)."""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kernel_session import KernelSession, kernel_after, needs_clicks_mid_cell

pytestmark = pytest.mark.slow

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SETUP = """
%load_ext nbscale
import json, time, torch, nbscale
from nbscale.ui import widget_front_end
from tests.training.digits import digits, tiny_net
torch.set_num_threads(1)
widget_front_end.SEEN.set()  # as a browser's first view of a widget sets it
(train_x, train_y), val = digits()

def for_seconds(seconds):
    first = []
    def stop(info):
        first.append(time.time())
        return time.time() - first[0] > seconds
    return stop
"""
TRAIN = """
opts = nbscale.TrainingOptions("sgdm", max_epochs=10_000, mini_batch_size=16, verbose=False, validation_data=val,
                               validation_frequency=40, plots="training-progress", output_fn=for_seconds(4))
net, info = nbscale.train(tiny_net(), (train_x, train_y), opts)
print(json.dumps({"loss": info.training_loss, "val_loss": [v for v in info.validation_loss if v is not None]}))
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelSession]:
    with kernel_after(SETUP) as session:
        yield session


def run_collecting(kernel: KernelSession, code: str, on_message: Callable[[dict[str, Any]], None] = print) -> list:
    """Execute `code` and return every iopub message of the cell (comm messages too), each handed to `on_message`
    as it comes."""
    messages: list[dict[str, Any]] = []
    message_id = kernel.client.execute(code)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            message = kernel.client.get_iopub_msg(timeout=0.2)
        except Exception:  # queue.Empty
            continue
        if message["parent_header"].get("msg_id") != message_id and message["msg_type"] != "comm_msg":
            continue
        if message["msg_type"] == "status" and message["parent_header"].get("msg_id") == message_id:
            if message["content"]["execution_state"] == "idle":
                return messages
        messages.append(message)
        on_message(message)
    raise TimeoutError(code)


def live_figure_comm(messages: list[dict[str, Any]]) -> str:
    opens = [m for m in messages if m["msg_type"] == "comm_open" and "spec" in m["content"]["data"]["state"]]
    assert len(opens) == 1, [m["content"]["data"]["state"].get("_view_name") for m in opens]
    return str(opens[0]["content"]["comm_id"])


def custom_messages(messages: list[dict[str, Any]], comm_id: str) -> list[tuple[dict[str, Any], int]]:
    """(content, its size in bytes) of each custom message the kernel sent the live figure, its columns (one float64
    buffer per key) read back into `content["columns"]`."""
    sent = []
    for m in messages:
        data = m["content"].get("data", {})
        if m["msg_type"] != "comm_msg" or m["content"]["comm_id"] != comm_id or data.get("method") != "custom":
            continue
        content, buffers = data["content"], [bytes(b) for b in m["buffers"]]
        columns = {key: array("d", buffer).tolist() for key, buffer in zip(content["keys"], buffers, strict=True)}
        sent.append(({**content, "columns": columns}, len(json.dumps(content)) + sum(map(len, buffers))))
    return sent


def printed(messages: list[dict[str, Any]]) -> dict[str, Any]:
    text = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    return dict(json.loads(text.strip().splitlines()[-1]))


@needs_clicks_mid_cell  # the live figure hears its view while the cell runs
def test_train_sends_the_widget_only_new_points_and_leaves_the_final_png(kernel: KernelSession) -> None:
    messages = run_collecting(kernel, TRAIN, on_message=lambda _: None)
    comm_id = live_figure_comm(messages)
    sent = custom_messages(messages, comm_id)
    trained = printed(messages)
    assert len(sent) >= 6, sent  # a push every 0.5 s of the 4 s run
    # the first push sends what there is; no view said "ready", so every later one sends only what is new
    assert [content["type"] for content, _ in sent] == ["reset"] + ["points"] * (len(sent) - 1)
    # each loss reached the widget once, in order, as the run recorded it (no value twice, none left out) up to the
    # last push; what came after it is in the final PNG
    received = [v for content, _ in sent for v in content["columns"].get("loss", [])]
    assert received == pytest.approx(trained["loss"][: len(received)])
    assert len(received) > len(trained["loss"]) / 2, (len(received), len(trained["loss"]))
    validated = [v for content, _ in sent for v in content["columns"].get("val_loss", [])]
    assert len(validated) >= 2 and validated == pytest.approx(trained["val_loss"][: len(validated)])
    # small, and not growing with the run: the last messages are no larger than the early ones, with room for a tick
    # that a busy machine let run longer
    sizes = [size for _, size in sent[1:-1]]
    for content, size in sent:  # 8 bytes a value and a short header: no copy of what was sent before
        assert size <= 8 * sum(map(len, content["columns"].values())) + 300, (size, content["keys"])
    assert max(sizes) < 64_000, sizes  # a tick's worth of a fast loop (hundreds of iterations), not the run's
    assert max(sizes[len(sizes) // 2 :]) <= 3 * max(sizes[: len(sizes) // 2]), sizes
    # the display: the widget beside a PNG while live, the final PNG alone at the end
    figures = [m["content"]["data"] for m in messages if m["msg_type"] == "update_display_data"]
    live = [data for data in figures if WIDGET_VIEW in data]
    assert len(live) == 1 and "image/png" in live[0] and live[0][WIDGET_VIEW]["model_id"] == comm_id
    final = [data for data in figures if "image/png" in data][-1]
    assert WIDGET_VIEW not in final and final["image/png"] != live[0]["image/png"]
    assert any(m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id for m in messages)


@needs_clicks_mid_cell  # the live figure hears its view while the cell runs
def test_a_view_that_opens_gets_every_point_once_then_new_ones_again(kernel: KernelSession) -> None:
    comm: dict[str, str] = {}

    def say_ready_once(message: dict[str, Any]) -> None:
        """As the browser's view does when it opens: a custom "ready" on the widget's comm, mid-run."""
        if message["msg_type"] == "comm_open" and "spec" in message["content"]["data"]["state"]:
            comm["id"] = message["content"]["comm_id"]
            return
        content = message["content"]
        if message["msg_type"] != "comm_msg" or content["comm_id"] != comm.get("id") or "sent" in comm:
            return
        if content["data"].get("method") == "custom":  # a push: the figure is shown (a browser draws it now)
            comm["sent"] = "yes"
            data = {"method": "custom", "content": {"type": "ready"}}
            request = kernel.client.session.msg("comm_msg", {"comm_id": comm["id"], "data": data})
            kernel.client.shell_channel.send(request)

    messages = run_collecting(kernel, TRAIN, say_ready_once)
    sent = custom_messages(messages, live_figure_comm(messages))
    kinds = [content["type"] for content, _ in sent]
    assert kinds.count("reset") == 2 and kinds[0] == "reset", kinds
    reset = kinds.index("reset", 1)
    losses = printed(messages)["loss"]
    # the reset holds every loss so far, and the pushes after it the rest: the view has the whole run once
    after = [v for content, _ in sent[reset:] for v in content["columns"].get("loss", [])]
    assert after == pytest.approx(losses[: len(after)]) and len(after) > len(sent[reset][0]["columns"]["loss"])


@needs_clicks_mid_cell  # the live figure hears its view while the cell runs
def test_a_monitor_sends_the_widget_only_new_points(kernel: KernelSession) -> None:
    messages = run_collecting(
        kernel,
        """
net = tiny_net()
monitor = nbscale.TrainingMonitor(metrics=["loss"])
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
losses, started, step = [], time.time(), 0
while time.time() - started < 4:
    for start in range(0, 1500, 16):
        loss = torch.nn.functional.cross_entropy(net(train_x[start:start + 16]), train_y[start:start + 16])
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        step += 1
        monitor.record(step, loss=loss)
        losses.append(loss.item())
monitor.close()
print(json.dumps({"loss": losses}))
""",
        on_message=lambda _: None,
    )
    sent = custom_messages(messages, live_figure_comm(messages))
    kinds = [content["type"] for content, _ in sent]
    assert len(sent) >= 4 and kinds == ["reset"] + ["points"] * (len(sent) - 1), kinds
    received = [v for content, _ in sent for v in content["columns"].get("loss", [])]
    assert received == pytest.approx(printed(messages)["loss"][: len(received)], rel=1e-5)
    final = [
        m["content"]["data"]
        for m in messages
        if m["msg_type"] == "update_display_data" and "image/png" in m["content"]["data"]
    ][-1]
    assert WIDGET_VIEW not in final


def test_draw_live_figures_false_keeps_pngs_even_after_a_view_was_seen(kernel: KernelSession) -> None:
    """The opt-out docs/ui.md names: a kernel whose front end drew a widget draws its training figures as PNGs again,
    and its Stop button no longer counts views (no comm message while the cell runs)."""
    off = """
from nbscale.ui.widget_front_end import draw_live_figures
draw_live_figures(False)
from nbscale.ui.stop_button import stop_button
from nbscale.training.events import StopSignal
print(widget_front_end.known(), widget_front_end.ASKED.is_set(), stop_button(StopSignal())._view_count)
"""
    result = kernel.run(off)
    assert result.ok, result.text
    assert result.stdout.split() == ["False", "False", "None"]
    try:
        messages = run_collecting(kernel, TRAIN.replace("for_seconds(4)", "for_seconds(2)"), on_message=lambda _: None)
    finally:
        kernel.run("draw_live_figures(); widget_front_end.SEEN.set()")  # as SETUP left it, for any later test
    assert not [m for m in messages if m["msg_type"] == "comm_open" and "spec" in m["content"]["data"]["state"]]
    figures = [m["content"]["data"] for m in messages if m["msg_type"] in ("display_data", "update_display_data")]
    pngs = [data for data in figures if "image/png" in data]
    assert len(pngs) >= 2 and not [data for data in pngs if WIDGET_VIEW in data]  # no widget beside the PNG
    assert printed(messages)["loss"]
