"""What one process needs to run the training loop: a LoopSetup, built in one place (`loop_setup`) from
what every runner gives and a `Where`, what differs by where the loop runs; and the LoopResult it gives back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbscale.training.plan import RunPlan
from nbscale.user_warnings import warn_user


@dataclass
class LoopSetup:
    """Everything one process needs to run the loop."""

    model: nn.Module
    train_data: Any  # a Dataset
    plan: RunPlan  # the run's resolved choices (nbscale.training.plan): what the loop reads instead of options
    device: torch.device
    seed: int
    hardware: str
    publish: Callable[[Any], None]  # the event channel (rank 0) or a no-op
    stop_reason: Callable[[], str | None]  # polled at the end of each iteration
    validation_data: Any = None
    resume: dict[str, Any] | None = None
    counts: list[int] = field(default_factory=lambda: [0])  # samples per rank in each global batch
    rank: int = 0
    group: torch.distributed.ProcessGroup | None = None  # the ranks with work, when more than one has; else None
    is_main: bool = True  # writes checkpoints
    # tells the user what the run changed or why it ended (a RuntimeWarning here; a pool's main rank sends them
    # to the notebook, which warns there once, at the user's line); None on a pool's other ranks
    warn: Callable[[str], None] | None = field(default=lambda message: warn_user(message, RuntimeWarning))
    # a listener needs every iteration's figures at once (output_fn; on a pool publish waits for its answer)
    read_each_iteration: bool = False


def _warn_here(message: str) -> None:
    warn_user(message, RuntimeWarning)


@dataclass(frozen=True)
class Where:
    """What differs by where the loop runs: the notebook (trainer), a pool rank (distributed) or a train_async
    worker (runs); the defaults are the notebook's."""

    resume: dict[str, Any] | None = None  # a checkpoint's state to go on from
    rank: int = 0
    group: torch.distributed.ProcessGroup | None = None  # the ranks with work, when more than one has; else None
    is_main: bool = True  # writes checkpoints
    # tells the user what the run changed or why it ended (a RuntimeWarning here; a pool's main rank sends them
    # to the notebook, which warns there once, at the user's line); None on a pool's other ranks
    warn: Callable[[str], None] | None = _warn_here
    # a listener needs every iteration's figures at once (output_fn; on a pool publish waits for its answer)
    read_each_iteration: bool = False


def loop_setup(
    model: nn.Module,
    train_data: Any,
    plan: RunPlan,
    *,
    device: torch.device,
    seed: int,
    hardware: str,
    publish: Callable[[Any], None],
    stop_reason: Callable[[], str | None],
    counts: list[int],
    where: Where = Where(),  # frozen: one shared default is safe
) -> LoopSetup:
    """The one place a LoopSetup is built: in the notebook (trainer), on each pool rank (distributed) and on a
    train_async worker (runs). The validation data are the plan's; `plan` is the one made before training
    (trainer.checked_inputs); `where` holds what differs by place."""
    return LoopSetup(
        model=model,
        train_data=train_data,
        plan=plan,
        device=device,
        seed=seed,
        hardware=hardware,
        publish=publish,
        stop_reason=stop_reason,
        validation_data=plan.validation_data,
        counts=counts,
        resume=where.resume,
        rank=where.rank,
        group=where.group,
        is_main=where.is_main,
        warn=where.warn,
        read_each_iteration=where.read_each_iteration,
    )


@dataclass
class LoopResult:
    stop_reason: str
    output_network_iteration: int
    iteration: int
    warnings: list[str] = field(default_factory=list)  # on a pool, what the notebook must warn of
    # on a pool, the output network's weights for the notebook (in the notebook's process it was trained in place)
    state_dict: dict[str, torch.Tensor] = field(default_factory=dict)
