"""Displays drawn from a thread after the cell that showed them has ended (`nbscale.show(run)`).

A kernel tags each output with the request of a cell (its parent message). ipykernel >= 7 lets a thread keep the
cell that showed a display (`set_thread_parent`), which JupyterLab and Notebook follow. A client that reads only
the cell it is running (nbclient, `jupyter nbconvert --execute`, papermill) drops those outputs once that cell
has ended, though it applies an update to a display of any cell by its display id. So a new output goes to the
showing cell only, and each update goes there and, when another cell ran since, with the latest cell's request
too: an update changes nothing where its display id is not shown.
"""

from __future__ import annotations

from typing import Any


def kernel_shell() -> Any:
    """The Jupyter kernel's shell, or None outside a kernel (a script, a terminal IPython)."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


class CellOutputs:
    """Made in the main thread while the showing cell runs; `pin()` and `mirrored(handle)` in the drawing thread."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.publisher: Any = getattr(shell, "display_pub", None)
        self.parent = getattr(self.publisher, "parent_header", None)  # the showing cell's request

    def pin(self) -> None:
        """Send this thread's new outputs to the showing cell (ipykernel >= 7; else they go to the latest cell)."""
        if self.parent and callable(getattr(self.publisher, "set_thread_parent", None)):
            self.publisher.set_thread_parent(self.parent)

    def mirrored(self, handle: Any) -> MirroredHandle:
        """`handle` (an IPython DisplayHandle) whose updates also reach a client running a later cell."""
        return MirroredHandle(handle, self)

    def latest_other(self) -> Any:
        """The request of the cell run last, where that is not the showing cell (None otherwise)."""
        from jupyter_client.session import extract_header

        get_parent = getattr(self.shell, "get_parent", None)  # an unpinned thread's parent: the latest request
        latest = extract_header(get_parent()) if callable(get_parent) and get_parent() else None
        if not latest or not self.parent or latest.get("msg_id") == self.parent.get("msg_id"):
            return None
        return latest


class MirroredHandle:
    """A display handle whose `update` goes to the showing cell and, after it, to the latest other cell, from
    any thread (a drawing thread, the pool's receiver thread)."""

    def __init__(self, handle: Any, outputs: CellOutputs) -> None:
        self.handle, self.outputs = handle, outputs

    def update(self, obj: Any, **kwargs: Any) -> None:
        publisher, showing = self.outputs.publisher, self.outputs.parent
        if not showing or not callable(getattr(publisher, "reset_thread_parent", None)):
            self.handle.update(obj, **kwargs)  # an older kernel: to the latest cell, as any output of a thread
            return
        latest = self.outputs.latest_other()
        for parent in (showing, latest) if latest is not None else (showing,):
            token = publisher.set_thread_parent(parent)
            try:
                self.handle.update(obj, **kwargs)
            finally:
                publisher.reset_thread_parent(token)
