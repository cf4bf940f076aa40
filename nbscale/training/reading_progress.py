"""How a process reads data before training: the PreparingData events it tells, and its data's seeds."""

from __future__ import annotations

from typing import Any

from nbscale.data.preparing import Progress
from nbscale.training.events import PreparingData
from nbscale.training.loop_setup import LoopSetup


def progress(setup: LoopSetup, what: str, data: Any) -> Progress:
    """Counts the items of `data` this process reads before training, told as PreparingData events: done by this
    process, of all the items (on a pool the notebook adds the ranks' counts up)."""
    unit = "files" if getattr(data, "files", None) else "items"
    whole = len(data)

    def report(done: int, total: int) -> None:
        setup.publish(PreparingData(what, done, whole, unit))

    return Progress(report)


def loader_seed(setup: LoopSetup) -> int:
    """The seed of a DataLoader's own random stream: a rank's background processes draw other numbers than
    another rank's."""
    return (setup.seed * 1_000_003 + setup.rank) % 2**62


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's random augmentation: a pure function, so resume and every rank draw the same."""
    return (seed * 1_000_003 + epoch) % 2**62
