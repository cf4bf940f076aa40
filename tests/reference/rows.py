"""The rows of the differential matrix: each a Row (tests.reference.plain) that nbscale.train and the plain PyTorch
loop run alike. A row that differs on purpose says why beside it (none does today)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from tests.reference.plain import Row, accuracy, classes, rmse, values

VALIDATION = classes(20, seed=5)


def top2(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float((outputs.topk(2, dim=1).indices == targets[:, None]).any(1).float().mean())


def margin(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A callable metric: one value per sample (the true class's score over the mean score)."""
    return outputs.gather(1, targets[:, None])[:, 0] - outputs.mean(1)


def mean_margin(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float(margin(outputs, targets).mean())


def macro_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float(MulticlassAccuracy(num_classes=3, average="macro")(outputs, targets))


def smoothed(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, targets, label_smoothing=0.1)


def mse_per_sample(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MSE on outputs (N, 1) and targets (N,), per sample: what nbscale's contract says "mse" computes there."""
    return nn.functional.mse_loss(outputs, targets.view(-1, 1))


def mixup(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, training: bool = True) -> Any:
    """A step_fn that mixes each batch with itself rolled by one while training, and is plain otherwise; its loss
    smooths the labels, so a validation loss that is not the step's (plain cross-entropy) shows."""
    if not training:
        outputs = model(inputs)
        return smoothed(outputs, targets), outputs
    outputs = model(0.7 * inputs + 0.3 * inputs.roll(1, 0))
    return 0.7 * smoothed(outputs, targets) + 0.3 * smoothed(outputs, targets.roll(1, 0)), outputs


def weighted_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, training: bool = True) -> Any:
    """A step_fn of each sample alone (no mixing across the batch): the smoothed loss, weighted up while training."""
    outputs = model(inputs)
    return (1.5 if training else 1.0) * smoothed(outputs, targets), outputs


def one_cycle(optimizer: torch.optim.Optimizer) -> Any:
    # steps_per_epoch=len(loader): 5 with the partial batch, which the loader keeps (drop_last=False)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=3, steps_per_epoch=5)


def step_lr(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def plateau(mode: str) -> Any:
    def schedule(optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode, factor=0.5, patience=0)

    return schedule


def sgdm(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum, as TrainingOptions("sgdm", initial_learn_rate=0.05, l2_regularization=0) makes it."""
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def cosine(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=15)


NAMED_SGDM = {"solver": "sgdm", "initial_learn_rate": 0.05, "momentum": 0.9, "l2_regularization": 0.0}


def rows() -> dict[str, Row]:
    """Every in-process row by name (the pool rows are a selection of them)."""
    with_accuracy: dict[str, Any] = {"reference_metrics": {"accuracy": accuracy}, "validation": VALIDATION}
    return {
        "cross-entropy": Row(classes(), **with_accuracy),
        "mse, (N, 1) targets": Row(
            values(), outputs=1, loss="mse", reference_loss=nn.MSELoss(), reference_metrics={"rmse": rmse}
        ),
        "mse, (N,) targets": Row(
            values(column=False),
            outputs=1,
            loss="mse",
            reference_loss=mse_per_sample,
            reference_metrics={"rmse": rmse},
        ),
        "l1": Row(values(), outputs=1, loss="l1", reference_loss=nn.L1Loss()),
        "binary cross-entropy": Row(
            _binary(), outputs=1, loss="binary-crossentropy", reference_loss=nn.BCEWithLogitsLoss()
        ),
        "a callable loss": Row(classes(), loss=smoothed, reference_loss=smoothed, validation=VALIDATION),
        "step_fn": Row(classes(), step_fn=mixup, reference_metrics={"accuracy": accuracy}),
        "step_fn with validation": Row(classes(), step_fn=mixup, **with_accuracy),
        "step_fn of each sample, with validation": Row(classes(), step_fn=weighted_step, **with_accuracy),
        "metrics by name": Row(
            classes(),
            metrics=("accuracy", "top2-accuracy"),
            reference_metrics={"accuracy": accuracy, "top2-accuracy": top2},
            validation=VALIDATION,
        ),
        "torchmetrics": Row(
            classes(),
            metrics=[("macro_accuracy", MulticlassAccuracy(num_classes=3, average="macro"))],
            reference_metrics={"macro_accuracy": macro_accuracy},
            validation=VALIDATION,
        ),
        "callable metrics": Row(
            classes(), metrics=[("margin", margin)], reference_metrics={"margin": mean_margin}, validation=VALIDATION
        ),
        "schedule by name: piecewise": Row(
            classes(),
            optimizer=sgdm,
            scheduler=step_lr,
            each="epoch",
            options={
                **NAMED_SGDM,
                "learn_rate_schedule": "piecewise",
                "learn_rate_drop_period": 1,
                "learn_rate_drop_factor": 0.5,
            },
        ),
        "schedule by name: cosine": Row(
            classes(), optimizer=sgdm, scheduler=cosine, options={**NAMED_SGDM, "learn_rate_schedule": "cosine"}
        ),
        "OneCycleLR per iteration": Row(classes(), scheduler=one_cycle),
        "StepLR per epoch": Row(classes(), scheduler=step_lr, each="epoch"),
        "ReduceLROnPlateau, min mode": Row(classes(), scheduler=plateau("min"), each="validation", **with_accuracy),
        "ReduceLROnPlateau, max mode on accuracy": Row(
            classes(),
            scheduler=plateau("max"),
            each="validation",
            plateau_on="accuracy",
            options={"objective_metric": "accuracy"},
            **with_accuracy,
        ),
    }


def _binary() -> Any:
    data = classes()
    inputs, labels = data.tensors
    return type(data)(inputs, (labels > 0).float()[:, None])
