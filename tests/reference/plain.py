"""The plain PyTorch loop the differential suite compares nbscale.train with, and the pieces both sides share.

`plain_loop` is the loop of PyTorch's tutorials: for each epoch, `for inputs, targets in loader`, forward, loss,
zero_grad, backward, step, and the scheduler stepped where its kind asks. It validates where nbscale validates
(after iteration 1, every `validate_every` iterations and after the last), so ReduceLROnPlateau sees the same
validations. `Row` runs one row of the matrix on both sides and compares the loss, learn-rate and metric
histories and the final weights.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbscale
from nbscale import TrainingOptions

TOLERANCE = 1e-5
Metric = Callable[[torch.Tensor, torch.Tensor], float]  # (outputs, targets) -> the value over those samples


def classes(count: int = 38, seed: int = 0) -> TensorDataset:
    """`count` samples of 6 features in 3 classes."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, 6, generator=generator)
    return TensorDataset(inputs, (inputs[:, 0] + inputs[:, 1] > 0).long() + (inputs[:, 2] > 1).long())


def values(count: int = 38, seed: int = 0, column: bool = True) -> TensorDataset:
    """`count` samples of 6 features and a real target, (N, 1) when `column`, else (N,)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, 6, generator=generator)
    targets = inputs @ torch.linspace(-1, 1, 6) + 0.1 * torch.randn(count, generator=generator)
    return TensorDataset(inputs, targets[:, None] if column else targets)


def network(outputs: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, outputs))


def loader(data: TensorDataset, batch_size: int = 8, shuffle: bool = True, drop_last: bool = False) -> DataLoader:
    """A DataLoader with its own generator (a loader without one draws from torch's global stream, from which
    nbscale.train draws its run seed first)."""
    return DataLoader(
        data, batch_size, shuffle=shuffle, drop_last=drop_last, generator=torch.Generator().manual_seed(1)
    )


@dataclass
class History:
    training_loss: list[float] = field(default_factory=list)
    learn_rate: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    validation_loss: dict[int, float] = field(default_factory=dict)  # iteration -> value
    validation_metrics: dict[str, dict[int, float]] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)


def _forward(model: nn.Module, inputs: Any, targets: Any, loss_fn: Any, step_fn: Any, training: bool) -> Any:
    if step_fn is None:
        outputs = model(inputs)
        return loss_fn(outputs, targets), outputs
    keyword = {"training": training} if "training" in inspect.signature(step_fn).parameters else {}
    result = step_fn(model, inputs, targets, **keyword)
    return result if isinstance(result, tuple) else (result, None)


@torch.no_grad()
def _evaluate(model: nn.Module, data: DataLoader, loss_fn: Any, step_fn: Any, metrics: dict[str, Metric]) -> Any:
    model.eval()
    total, count, outputs, targets = 0.0, 0, [], []
    for inputs, labels in data:
        loss, output = _forward(model, inputs, labels, loss_fn, step_fn, training=False)
        total, count = total + float(loss) * len(labels), count + len(labels)
        outputs.append(output)
        targets.append(labels)
    model.train()
    found = {name: metric(torch.cat(outputs), torch.cat(targets)) for name, metric in metrics.items()}
    return total / count, found


def plain_loop(
    model: nn.Module,
    data: DataLoader,
    epochs: int,
    optimizer: torch.optim.Optimizer,
    *,
    loss_fn: Any = None,
    step_fn: Any = None,
    scheduler: Any = None,
    each: str = "iteration",
    metrics: dict[str, Metric] | None = None,
    validation: DataLoader | None = None,
    validate_every: int = 0,
    plateau_on: str = "loss",
) -> History:
    """Train `model` in place as a plain PyTorch loop does; its histories and final weights."""
    history, metrics = History(), metrics or {}
    loss_fn = loss_fn if loss_fn is not None or step_fn is not None else nn.CrossEntropyLoss()
    total, iteration = epochs * len(data), 0
    model.train()
    for _ in range(epochs):
        for inputs, targets in data:
            iteration += 1
            history.learn_rate.append(optimizer.param_groups[0]["lr"])
            loss, outputs = _forward(model, inputs, targets, loss_fn, step_fn, training=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None and each == "iteration":
                scheduler.step()
            history.training_loss.append(float(loss.detach()))
            for name, metric in metrics.items():
                history.metrics.setdefault(name, []).append(metric(outputs.detach(), targets))
            if validation is not None and (iteration == 1 or iteration % validate_every == 0 or iteration == total):
                loss_value, found = _evaluate(model, validation, loss_fn, step_fn, metrics)
                history.validation_loss[iteration] = loss_value
                for name, value in found.items():
                    history.validation_metrics.setdefault(name, {})[iteration] = value
                if each == "validation":
                    scheduler.step(loss_value if plateau_on == "loss" else found[plateau_on])
        if scheduler is not None and each == "epoch":
            scheduler.step()
    history.state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return history


def nbscale_history(net: nn.Module, info: Any) -> History:
    """The same histories as nbscale.train's TrainingInfo records them."""
    validated = [k for k, value in enumerate(info.validation_loss) if value is not None]
    return History(
        training_loss=list(info.training_loss),
        learn_rate=list(info.learn_rate),
        metrics={name: list(found) for name, found in info.metrics.items()},
        validation_loss={info.iteration[k]: info.validation_loss[k] for k in validated},
        validation_metrics={
            name: {info.iteration[k]: found[k] for k in validated} for name, found in info.validation_metrics.items()
        },
        state={name: tensor.detach().clone() for name, tensor in net.state_dict().items()},
    )


def assert_same(got: History, expected: History, atol: float = TOLERANCE) -> None:
    """Every history and every weight within `atol`, each difference named."""
    assert len(got.training_loss) == len(expected.training_loss), "iterations differ"
    _close("training loss", got.training_loss, expected.training_loss, atol)
    _close("learn rate", got.learn_rate, expected.learn_rate, atol)
    for name, found in expected.metrics.items():
        _close(f"training {name}", got.metrics[name], found, atol)
    assert got.validation_loss.keys() == expected.validation_loss.keys(), "validated iterations differ"
    _close("validation loss", list(got.validation_loss.values()), list(expected.validation_loss.values()), atol)
    for name, found in expected.validation_metrics.items():
        _close(f"validation {name}", list(got.validation_metrics[name].values()), list(found.values()), atol)
    for name, tensor in expected.state.items():
        assert torch.allclose(got.state[name], tensor, atol=atol, rtol=0), f"final weight {name} differs"


def _close(what: str, got: list[Any], expected: list[Any], atol: float) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} values, expected {len(expected)}"
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a is not None and abs(a - b) <= atol, f"{what} at {k + 1}: {a} != {b}"


@dataclass
class Row:
    """One row of the matrix: the data, network, optimizer and scheduler factories, loss or step, metrics, for
    both sides; `options` are nbscale's further fields (placement, schedule names, objective...)."""

    train: TensorDataset
    outputs: int = 3
    epochs: int = 3
    shuffle: bool = True
    drop_last: bool = False
    loss: Any = None  # nbscale's loss_fn (a name or callable); None: cross-entropy
    reference_loss: Any = nn.CrossEntropyLoss()
    step_fn: Any = None
    optimizer: Callable[[Any], torch.optim.Optimizer] = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)
    scheduler: Any = None  # optimizer -> scheduler, on both sides
    each: str = "iteration"  # when the scheduler steps: "iteration", "epoch" or "validation"
    plateau_on: str = "loss"
    metrics: Any = None  # nbscale's metrics option
    reference_metrics: dict[str, Metric] = field(default_factory=dict)
    validation: TensorDataset | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def loaders(self) -> tuple[DataLoader, DataLoader | None]:
        train = loader(self.train, shuffle=self.shuffle, drop_last=self.drop_last)
        return train, (DataLoader(self.validation, 8) if self.validation is not None else None)

    def reference(self) -> History:
        model = network(self.outputs)
        optimizer = self.optimizer(model.parameters())
        scheduler = self.scheduler(optimizer) if self.scheduler is not None else None
        train, validation = self.loaders()
        return plain_loop(
            model,
            train,
            self.epochs,
            optimizer,
            loss_fn=self.reference_loss,
            step_fn=self.step_fn,
            scheduler=scheduler,
            each=self.each,
            metrics=self.reference_metrics,
            validation=validation,
            validate_every=len(train),
            plateau_on=self.plateau_on,
        )

    def trained(self, **more: Any) -> History:
        train, validation = self.loaders()
        fields: dict[str, Any] = {
            "solver": self.optimizer,
            "max_epochs": self.epochs,
            "verbose": False,
            "validation_data": validation,
            "validation_frequency": len(train),
            "metrics": self.metrics,
        }
        if self.scheduler is not None:
            fields["learn_rate_schedule"] = self.scheduler
            fields["learn_rate_schedule_step"] = "epoch" if self.each == "epoch" else "iteration"
        net, info = nbscale.train(
            network(self.outputs),
            train,
            TrainingOptions(**{**fields, **self.options, **more}),
            loss_fn=self.loss,
            step_fn=self.step_fn,
        )
        return nbscale_history(net, info)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float((outputs.argmax(1) == targets).float().mean())


def rmse(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float(((outputs.reshape(targets.shape) - targets) ** 2).mean().sqrt())
