"""Metrics over the ranks of a real pool (2 worker processes, torch.distributed gloo): summing the ranks' states
gives the metric of all their predictions together, not the mean of per-rank values."""

from __future__ import annotations

import pytest
import torch
from sklearn import metrics as sk

import nbscale

CLASSES = 5


def shares() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's (scores, labels): rank 0 has 40 samples of classes 0-1, all right; rank 1 has
    90, half wrong and spread over every class, so per-rank F-scores differ much from the F-score of all."""
    generator = torch.Generator().manual_seed(7)
    held = []
    for samples, classes, boost in ((40, 2, 10.0), (90, CLASSES, 0.7)):
        labels = torch.randint(0, classes, (samples,), generator=generator)
        scores = torch.randn(samples, CLASSES, generator=generator)
        scores[torch.arange(samples), labels] += boost
        held.append((scores, labels))
    return held


def rank_metrics() -> dict[str, dict[str, float | None]]:
    """On each rank: its share's state summed over 3 uneven batches, then over the ranks with one all_reduce."""
    import torch.distributed as dist
    import torchmetrics

    from nbscale.training.run_metrics import resolve_metrics

    scores, labels = shares()[dist.get_rank()]
    f1 = torchmetrics.classification.MulticlassF1Score(num_classes=CLASSES, average="macro")
    metrics = resolve_metrics(["fscore", ("torchmetrics_f1", f1), "accuracy"], regression=False)
    metrics.check(scores[:8], labels[:8])
    state = sum(metrics.state(scores[part], labels[part]) for part in (slice(0, 8), slice(8, 30), slice(30, None)))
    assert isinstance(state, torch.Tensor)
    alone = metrics.values(state)
    dist.all_reduce(state)
    return {"all": metrics.values(state), "alone": alone}


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_summed_states_over_two_ranks_give_sklearns_fscore_of_all_predictions_not_the_mean_of_ranks(
    pool: nbscale.Pool,
) -> None:  # the pool of 2 CPU workers of tests/training/conftest.py
    results = pool.run(rank_metrics)
    every = shares()
    scores = torch.cat([s for s, _ in every])
    labels = torch.cat([y for _, y in every])
    expected = sk.f1_score(labels, scores.argmax(1), average="macro")
    for result in results:  # every rank reads the same values
        assert result["all"]["fscore"] == pytest.approx(expected, rel=1e-6)
        assert result["all"]["torchmetrics_f1"] == pytest.approx(expected, rel=1e-6)
        assert result["all"]["accuracy"] == pytest.approx(sk.accuracy_score(labels, scores.argmax(1)))
    per_rank = [result["alone"]["fscore"] for result in results]
    assert per_rank == pytest.approx([sk.f1_score(y, s.argmax(1), average="macro") for s, y in every], rel=1e-6)
    assert abs(sum(per_rank) / 2 - expected) > 0.05  # the data make a mean of per-rank F-scores visibly wrong
