"""Training metrics: each value equals sklearn's (or torchmetrics') on the same predictions, however the
batches split them; every bad metric is one clear OptionsError naming it and the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torchmetrics
from sklearn import metrics as sk

from nbscale import OptionsError, TrainingOptions
from nbscale.training.run_metrics import MetricSet, objective, resolve_metrics

CLASSES = 6


def predictions(samples: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores right about half the time; class 5 is never a label (only predicted sometimes)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES - 1, (samples,), generator=generator)
    scores = torch.randn(samples, CLASSES, generator=generator)
    scores[torch.arange(samples), labels] += 1.0
    return scores, labels


def summed_over_batches(
    metrics: MetricSet, outputs: torch.Tensor, targets: torch.Tensor, sizes: tuple[int, ...] = (7, 64, 100, 129)
) -> dict[str, float | None]:
    """The values from the states of uneven batches, summed (as the loop sums a bunch or a validation)."""
    metrics.check(outputs[: sizes[0]], targets[: sizes[0]])
    bounds = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    states = [metrics.state(outputs[a:b], targets[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return metrics.values(torch.stack(states).sum(0))


def test_class_metrics_equal_sklearns_on_the_same_predictions_whatever_the_batches() -> None:
    scores, labels = predictions()
    predicted = scores.argmax(1)
    values = summed_over_batches(
        resolve_metrics(["accuracy", "top3-accuracy", "precision", "recall", "fscore"], regression=False),
        scores,
        labels,
    )
    assert values["accuracy"] == pytest.approx(sk.accuracy_score(labels, predicted))
    assert values["top3-accuracy"] == pytest.approx(
        sk.top_k_accuracy_score(labels, scores.numpy(), k=3, labels=range(CLASSES))
    )
    for name, score in [("precision", sk.precision_score), ("recall", sk.recall_score), ("fscore", sk.f1_score)]:
        assert values[name] == pytest.approx(score(labels, predicted, average="macro", zero_division=0)), name


def test_top5_accuracy_counts_a_label_among_the_five_best_scores() -> None:
    scores, labels = predictions()
    values = summed_over_batches(resolve_metrics(["top5-accuracy"], regression=False), scores, labels)
    assert values["top5-accuracy"] == pytest.approx(
        sk.top_k_accuracy_score(labels, scores.numpy(), k=5, labels=range(CLASSES))
    )


def test_class_probabilities_as_targets_count_their_largest_class() -> None:
    scores, labels = predictions()
    one_hot = torch.nn.functional.one_hot(labels, CLASSES).float()
    values = summed_over_batches(resolve_metrics(["accuracy", "fscore"], regression=False), scores, one_hot)
    assert values["accuracy"] == pytest.approx(sk.accuracy_score(labels, scores.argmax(1)))
    assert values["fscore"] == pytest.approx(sk.f1_score(labels, scores.argmax(1), average="macro"))


def test_rmse_and_mae_equal_sklearns_over_every_output_element() -> None:
    generator = torch.Generator().manual_seed(1)
    outputs, targets = torch.randn(300, 3, generator=generator), torch.randn(300, 3, generator=generator)
    values = summed_over_batches(resolve_metrics(["rmse", "mae"], regression=True), outputs, targets)
    assert values["rmse"] == pytest.approx(math.sqrt(sk.mean_squared_error(targets, outputs)), rel=1e-5)
    assert values["mae"] == pytest.approx(sk.mean_absolute_error(targets, outputs), rel=1e-5)


def test_one_output_per_sample_is_compared_with_a_flat_target_vector() -> None:
    outputs, targets = torch.linspace(0, 1, 300)[:, None], torch.linspace(0, 2, 300)
    values = summed_over_batches(resolve_metrics(None, regression=True), outputs, targets)
    assert list(values) == ["rmse"]
    assert values["rmse"] == pytest.approx(math.sqrt(sk.mean_squared_error(targets, outputs[:, 0])), rel=1e-5)


def test_defaults_are_accuracy_for_classes_and_rmse_for_a_regression() -> None:
    assert resolve_metrics(None, regression=False).names == ("accuracy",)
    assert resolve_metrics(None, regression=True).names == ("rmse",)
    no_metrics = resolve_metrics((), regression=False)
    scores, labels = predictions()
    assert no_metrics.size == 0 and no_metrics.state(scores, labels).shape == (0,)
    assert no_metrics.values(no_metrics.state(scores, labels)) == {}


def test_a_state_is_a_float32_vector_of_size_and_no_samples_give_none() -> None:
    metrics = resolve_metrics(["accuracy", "fscore", "mae"], regression=False)
    scores, labels = predictions()
    with pytest.raises(OptionsError, match="'mae' is a regression metric"):
        metrics.check(scores, labels)
    metrics = resolve_metrics(["accuracy", "FScore"], regression=False)
    metrics.check(scores, labels)
    state = metrics.state(scores, labels)
    assert state.dtype == torch.float32 and state.shape == (metrics.size,) == (2 + 3 * CLASSES,)
    assert metrics.values(torch.zeros(metrics.size)) == {"accuracy": None, "fscore": None}


def test_torchmetrics_f1_with_summed_states_equals_sklearn_and_its_own_compute() -> None:
    scores, labels = predictions()
    f1 = torchmetrics.classification.MulticlassF1Score(num_classes=CLASSES, average="macro")
    values = summed_over_batches(resolve_metrics([f1], regression=False), scores, labels)
    expected = sk.f1_score(labels, scores.argmax(1), average="macro")
    assert values["MulticlassF1Score"] == pytest.approx(expected, rel=1e-6)
    assert float(f1(scores, labels)) == pytest.approx(values["MulticlassF1Score"], rel=1e-6)


def test_a_torchmetrics_metric_is_copied_never_changed_and_gives_its_direction() -> None:
    mse = torchmetrics.MeanSquaredError()
    metrics = resolve_metrics([("mse", mse)], regression=True)
    outputs, targets = torch.randn(50), torch.randn(50)
    values = summed_over_batches(metrics, outputs, targets, sizes=(20, 30))
    assert values["mse"] == pytest.approx(sk.mean_squared_error(targets, outputs), rel=1e-5)
    assert mse.total == 0 and mse.update_count == 0  # the user's metric object holds nothing of the run
    assert objective("mse", "auto", metrics) == ("mse", "minimize")


def test_a_torchmetrics_metric_keeping_every_prediction_is_refused_with_the_binned_fix() -> None:
    with pytest.raises(OptionsError) as refused:
        resolve_metrics([torchmetrics.classification.BinaryAUROC()], regression=False)
    assert "BinaryAUROC" in str(refused.value) and "thresholds=" in str(refused.value)
    assert "callable" in str(refused.value)
    binned = torchmetrics.classification.BinaryAUROC(thresholds=50)
    metrics = resolve_metrics([("auroc", binned)], regression=False)
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 2, (200,), generator=generator)
    probabilities = (labels + torch.randn(200, generator=generator)).sigmoid()
    values = summed_over_batches(metrics, probabilities, labels, sizes=(50, 150))
    assert values["auroc"] == pytest.approx(float(binned(probabilities, labels)), rel=1e-6)


def test_a_callable_is_averaged_over_samples_whether_it_returns_per_sample_values_or_a_batch_mean() -> None:
    def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs - targets).square()

    def mean_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs - targets).square().mean()

    outputs, targets = torch.randn(300), torch.randn(300)
    metrics = resolve_metrics([squared_error, ("batch_mean", mean_squared_error)], regression=True)
    values = summed_over_batches(metrics, outputs, targets)
    expected = sk.mean_squared_error(targets, outputs)
    assert values == pytest.approx({"squared_error": expected, "batch_mean": expected}, rel=1e-5)
    assert metrics.names == ("squared_error", "batch_mean")


def test_a_callable_returning_more_than_one_value_per_sample_is_refused_on_the_first_batch() -> None:
    def per_class(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return outputs.softmax(1)

    scores, labels = predictions()
    with pytest.raises(OptionsError, match=r"'per_class' returned float32 of shape \(300, 6\).*one value per sample"):
        resolve_metrics([per_class], regression=False).check(scores, labels)


def test_pairs_name_any_metric_and_duplicate_names_are_refused() -> None:
    metrics = resolve_metrics(
        [("f1", "fscore"), "accuracy", ("error", lambda o, y: (o.argmax(1) != y).float())], regression=False
    )
    scores, labels = predictions()
    values = summed_over_batches(metrics, scores, labels)
    assert values["error"] == pytest.approx(1 - values["accuracy"])
    assert values["f1"] == pytest.approx(sk.f1_score(labels, scores.argmax(1), average="macro"))
    with pytest.raises(OptionsError, match="two metrics are named 'accuracy'"):
        resolve_metrics(["accuracy", ("accuracy", "top2-accuracy")], regression=False)
    with pytest.raises(OptionsError, match="no name to show it by"):
        resolve_metrics([lambda o, y: o], regression=False)


@pytest.mark.parametrize(
    ("name", "suggested"),
    [("acuracy", "accuracy"), ("f1", "fscore"), ("RMSEE", "rmse"), ("top5", "top5-accuracy"), ("mse", "rmse")],
)
def test_an_unknown_metric_name_suggests_the_right_one(name: str, suggested: str) -> None:
    with pytest.raises(OptionsError, match=f"no metric named '{name}'. Did you mean '{suggested}'"):
        resolve_metrics([name], regression=False)
    with pytest.raises(OptionsError, match=f"Did you mean '{suggested}'"):
        TrainingOptions(metrics=("accuracy", name))


def test_a_regression_metric_on_class_labels_is_refused_naming_the_class_metrics() -> None:
    scores, labels = predictions()
    with pytest.raises(
        OptionsError,
        match=r"'rmse' is a regression metric, but the targets are class labels.*"
        r"use 'accuracy'",
    ):
        resolve_metrics(["rmse"], regression=False).check(scores, labels)


def test_a_class_metric_on_a_regressions_outputs_is_refused_naming_rmse() -> None:
    outputs, targets = torch.randn(40, 1), torch.randn(40)
    with pytest.raises(OptionsError, match=r"'fscore' is a classification metric.*metrics=\('rmse',\)"):
        resolve_metrics(["fscore"], regression=True).check(outputs, targets)
    with pytest.raises(OptionsError, match="'accuracy' is a classification metric"):
        resolve_metrics(["accuracy"], regression=True).check(torch.randn(40, 3), torch.randn(40, 3))


def test_things_that_are_not_metrics_are_refused_listing_what_is() -> None:
    for wrong in ([3], 3, [torch.nn.Linear]):
        with pytest.raises(OptionsError, match="metrics"):
            TrainingOptions(metrics=wrong)
    with pytest.raises(OptionsError, match="'loss' is the training loss's name"):
        resolve_metrics([("loss", "mae")], regression=True)
    assert TrainingOptions(metrics="fscore").metrics == "fscore"  # one metric alone is a sequence of one


def test_objective_directions_are_known_for_the_names_and_loss() -> None:
    metrics = resolve_metrics(
        ["accuracy", "top5-accuracy", "rmse", "mae", "precision", "recall", "fscore"], regression=False
    )
    assert objective("loss", "auto", metrics) == ("loss", "minimize")
    goals = {name: objective(name, "auto", metrics)[1] for name in metrics.names}
    assert goals == {
        "accuracy": "maximize",
        "top5-accuracy": "maximize",
        "rmse": "minimize",
        "mae": "minimize",
        "precision": "maximize",
        "recall": "maximize",
        "fscore": "maximize",
    }
    with pytest.raises(OptionsError, match="contradicts objective_metric='rmse'"):
        objective("rmse", "maximize", metrics)
    with pytest.raises(OptionsError, match="objective_goal='up' is not allowed"):
        objective("loss", "up", metrics)


def test_a_callables_objective_needs_a_goal() -> None:
    def error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) != targets).float()

    metrics = resolve_metrics(["accuracy", error], regression=False)
    with pytest.raises(OptionsError, match="cannot tell whether 'error' is better high or low"):
        objective("error", "auto", metrics)
    assert objective("error", "minimize", metrics) == ("error", "minimize")


def test_an_objective_metric_not_among_the_metrics_names_both_and_lists_the_metrics() -> None:
    metrics = resolve_metrics(["accuracy", "fscore"], regression=False)
    with pytest.raises(
        OptionsError,
        match=r"objective_metric='rmse' is not among the metrics \('accuracy', "
        r"'fscore'\).*metrics=\(\.\.\., 'rmse'\)",
    ):
        objective("rmse", "auto", metrics)
    with pytest.raises(OptionsError, match="objective_metric='fscore' is not among the metrics"):
        TrainingOptions(objective_metric="fscore")
    with pytest.raises(OptionsError, match=r"objective_metric='accuracy' is not among the metrics \('rmse'\)"):
        TrainingOptions(loss="mse", objective_metric="accuracy")
    chosen = TrainingOptions(metrics=("accuracy", "fscore"), objective_metric="fscore")
    assert chosen.objective_metric == "fscore" and chosen.objective_goal == "auto"
    assert TrainingOptions(objective_metric="accuracy").metrics is None  # the default for class labels
    assert TrainingOptions(objective_metric="rmse").metrics is None  # float targets make it the default


def test_a_batch_with_other_class_count_than_the_first_is_refused() -> None:
    metrics = resolve_metrics(["fscore"], regression=False)
    scores, labels = predictions()
    metrics.check(scores, labels)
    with pytest.raises(OptionsError, match="the outputs have 3 classes, but the first batch had 6"):
        metrics.state(scores[:, :3], labels % 3)


def test_a_state_reads_nothing_to_the_host_so_it_runs_on_meta_tensors_that_hold_no_data() -> None:
    # a meta tensor has a shape and no values: any .item(), .tolist() or branch on a value would raise, as on a
    # GPU it would wait for the device; this is how the loop keeps metrics from syncing every iteration
    def error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) != targets).float()

    classes = resolve_metrics(["accuracy", "top3-accuracy", "precision", "recall", "fscore", error], regression=False)
    scores, labels = predictions()
    classes.check(scores, labels)
    state = classes.state(scores.to("meta"), labels.to("meta"))
    assert state.device.type == "meta" and state.shape == (classes.size,)
    regression = resolve_metrics(["rmse", "mae"], regression=True)
    assert regression.state(torch.randn(8, 1, device="meta"), torch.randn(8, device="meta")).shape == (4,)


def test_a_bunchs_states_computed_together_equal_each_iterations_state() -> None:
    def error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) != targets).float()

    metrics = resolve_metrics(
        [
            "accuracy",
            "top2-accuracy",
            "fscore",
            error,
            torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES),
        ],
        regression=False,
    )
    scores, labels = predictions()
    metrics.check(scores[:50], labels[:50])
    bunch = [(scores[i : i + 50], labels[i : i + 50]) for i in range(0, 300, 50)]
    each = torch.stack([metrics.state(outputs, targets) for outputs, targets in bunch])
    assert torch.equal(metrics.states(bunch), each)
    uneven = [*bunch[:2], (scores[100:130], labels[100:130])]  # a validation's last, smaller batch
    assert torch.equal(metrics.states(uneven), torch.stack([metrics.state(o, y) for o, y in uneven]))
    regression = resolve_metrics(["rmse", "mae"], regression=True)
    pairs = [(torch.randn(16, 2), torch.randn(16, 2)) for _ in range(4)]
    assert torch.allclose(regression.states(pairs), torch.stack([regression.state(o, y) for o, y in pairs]))


def test_a_torchmetrics_collection_gives_its_metrics_by_key() -> None:
    collection = torchmetrics.MetricCollection(
        {
            "f1": torchmetrics.classification.MulticlassF1Score(num_classes=CLASSES, average="macro"),
            "recall_tm": torchmetrics.classification.MulticlassRecall(num_classes=CLASSES, average="macro"),
        }
    )
    metrics = resolve_metrics(["accuracy", collection], regression=False)
    assert metrics.names == ("accuracy", "f1", "recall_tm")
    scores, labels = predictions()
    values = summed_over_batches(metrics, scores, labels)
    assert values["recall_tm"] == pytest.approx(
        sk.recall_score(labels, scores.argmax(1), average="macro", zero_division=0), rel=1e-6
    )
