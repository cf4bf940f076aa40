"""Validation: loss and metrics over the validation data, summed over batches and ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbscale.data.batches import batch_length
from nbscale.data.loader_data import loader_of, validation_order
from nbscale.data.loading import BatchSource, make_batch_source
from nbscale.training.figures import KeptMetrics
from nbscale.training.loop_setup import LoopSetup
from nbscale.training.reading_progress import loader_seed, progress
from nbscale.training.run_metrics import summed_over


def validation_batch(validation_data: Any, training_batch: int) -> int:
    """Each rank's validation batch: a validation DataLoader's batch_size (TrainingOptions has no validation batch
    size), else `training_batch`, a rank's training batch (which fits, so this does)."""
    loader = loader_of(validation_data)
    return loader.batch_size if loader is not None else training_batch


class Validator:
    """Loss and metrics over the validation data (their states summed over the batches and the ranks), with the
    plain network in eval mode (never the compiled one: its last smaller batch and eval mode would compile it
    again); on a pool each rank takes every k-th sample, with the main rank's buffers (the network the user gets
    back: see `_take_main_ranks_buffers`)."""

    def __init__(self, setup: LoopSetup, model: nn.Module, autocast_dtype: Any) -> None:
        from nbscale.data.loading import as_dataset

        self.setup, self.model, self.autocast_dtype = setup, model, autocast_dtype
        data = as_dataset(setup.validation_data, "validation_data")
        active = sum(1 for c in setup.counts if c > 0)
        position = sum(1 for c in setup.counts[: setup.rank] if c > 0)
        # the samples a validation DataLoader gives (its sampler, its drop_last); each rank reads and holds only
        # the samples it validates
        order = validation_order(data)
        if active > 1:
            # torch's Dataset declares no __len__; as_dataset checked it
            order = (torch.arange(len(data)) if order is None else order)[position::active]  # type: ignore[arg-type]
        rows = order
        self.source: BatchSource | None = None
        self.batches: list[torch.Tensor] = []
        if rows is None or len(rows):
            self.source = make_batch_source(
                data,
                setup.device,
                setup.plan.placement.data_placement,
                False,
                seed=loader_seed(setup),
                rows=rows,
                progress=progress(setup, "validation data", data),
            )

    def split(self, batch: int) -> None:
        """Validate in batches of `batch` samples (once the training's mini-batch is settled)."""
        if self.source is not None:
            self.batches = list(torch.split(torch.arange(len(self.source)), batch))

    @torch.no_grad()
    def evaluate(self, metrics: KeptMetrics) -> tuple[float, dict[str, float | None]]:
        """(validation loss, each metric's value): one read to the host, after one all_reduce on a pool."""
        if self.setup.group is not None:
            _take_main_ranks_buffers(self.model, self.setup.group)
        self.model.eval()
        device = self.setup.device
        totals = torch.zeros(2 + metrics.size, device=device)  # loss sum, samples, the metrics' summed state
        # the same augmentation draws at every validation, so its figures compare over the run
        for inputs, labels in self.source.epoch(self.batches, self.setup.seed) if self.source is not None else ():
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                loss, outputs = self.setup.plan.step.validate(self.model, inputs, labels)  # or the user's step_fn
            count = batch_length(labels)
            totals[0] += loss.float() * count
            totals[1] += count
            if metrics.size and outputs is not None:
                totals[2:] += metrics.metrics.state(outputs, labels).to(device)
        loss_sum, count, *state = summed_over(self.setup.group, totals).tolist()
        return loss_sum / max(count, 1), metrics.values(state)


def _take_main_ranks_buffers(model: nn.Module, group: torch.distributed.ProcessGroup | None) -> None:
    """Every rank's buffers (BatchNorm's running statistics) become the main rank's, in place.

    Each rank's running statistics follow its own share of the data, while the network returned (and written to
    checkpoints) is the main rank's: validating with these makes the figures those of the returned network.
    Training is unchanged, since DistributedDataParallel itself broadcasts the main rank's buffers at the start of
    every forward pass (broadcast_buffers).
    """
    # the group's rank 0 is the main rank; named by its global rank, as torch 2.5 (no group_src=) takes it
    main_rank = 0 if group is None else torch.distributed.get_global_rank(group, 0)
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, src=main_rank, group=group)
