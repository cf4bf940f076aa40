"""A tensor sent to or from a pool worker keeps its PyTorch meaning: an nn.Parameter stays one, a channels_last
tensor stays channels_last, attributes set on it stay, and its values, dtype, shape and requires_grad are its
own, small (in the pickle) or large (out of band), as torch's own pickling gives them."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

import nbscale
from nbscale.pool.transport import OUT_OF_BAND_BYTES, deserialise, serialise

SMALL, LARGE = 16, OUT_OF_BAND_BYTES // 4 + 1  # float32 elements: in the pickle, out of band


def sent(value: object) -> object:
    """`value` through the pool's transport (its large buffers as a receiver maps them)."""
    frame = serialise(value, keep=False)
    buffers = [torch.frombuffer(bytearray(buffer), dtype=torch.uint8) for buffer in frame.buffers]
    return deserialise(frame.body, buffers)


def torch_pickled(value: object) -> object:
    return pickle.loads(pickle.dumps(value))


@pytest.mark.parametrize("elements", [SMALL, LARGE], ids=["small", "large"])
def test_a_parameter_arrives_as_a_parameter_with_its_attributes(elements: int) -> None:
    parameter = nn.Parameter(torch.randn(elements))
    parameter.shard = "rows"  # libraries tag parameters so
    frozen = nn.Parameter(torch.randn(elements), requires_grad=False)
    got, got_frozen = sent([parameter, frozen])
    assert type(got) is nn.Parameter and type(got_frozen) is nn.Parameter
    assert got.requires_grad and not got_frozen.requires_grad
    assert got.shard == "rows" == torch_pickled(parameter).shard
    assert torch.equal(got, parameter) and torch.equal(got_frozen, frozen)


@pytest.mark.parametrize("channels", [2, 256], ids=["small", "large"])
def test_a_channels_last_tensor_keeps_its_layout_and_values(channels: int) -> None:
    tensor = torch.randn(4, channels, 16, 16).to(memory_format=torch.channels_last)
    got = sent(tensor)
    assert got.stride() == tensor.stride() == torch_pickled(tensor).stride()
    assert torch.equal(got, tensor)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(40.0)[::3],  # a slice with gaps: sent contiguous
        torch.tensor(3),
        torch.zeros(0, 5),
        torch.tensor([True, False, True]),
        torch.randn(6, 5).bfloat16(),
        torch.randn(4, dtype=torch.complex64).conj(),
        torch.randn(5, requires_grad=True),
        torch.randint(0, 255, (LARGE,), dtype=torch.uint8),
        torch.randn(LARGE).double().t(),
    ],
    ids=["slice", "scalar", "empty", "bool", "bfloat16", "conj", "requires-grad", "large-uint8", "large-double"],
)
def test_values_dtype_shape_and_requires_grad_are_torchs_own(tensor: torch.Tensor) -> None:
    got, expected = sent(tensor), torch_pickled(tensor)
    assert type(got) is torch.Tensor
    assert (got.dtype, got.shape, got.requires_grad, got.is_leaf) == (
        expected.dtype,
        expected.shape,
        expected.requires_grad,
        True,
    )
    assert torch.equal(got.detach().resolve_conj(), tensor.detach().resolve_conj())


def test_a_model_reaches_a_worker_with_parameters_of_every_size_and_comes_back_trained() -> None:
    torch.manual_seed(0)  # a large channels_last weight, a small bias, a large and a small linear parameter
    model = nn.Sequential(nn.Conv2d(3, 512, 3), nn.Flatten(), nn.Linear(512 * 6 * 6, 10))
    model = model.to(memory_format=torch.channels_last)

    def kinds(net: nn.Module) -> list[tuple[str, str, bool]]:
        return [
            (name, type(p).__name__, p.dim() != 4 or p.is_contiguous(memory_format=torch.channels_last))
            for name, p in net.named_parameters()
        ]

    with nbscale.Pool(1, cpu=True) as pool:
        assert pool.run(kinds, model) == [kinds(model)]
        assert [kind for _, kind, _ in kinds(model)] == ["Parameter"] * 4
        data = torch.utils.data.TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,)))
        options = nbscale.TrainingOptions(
            "sgdm", max_epochs=1, mini_batch_size=16, verbose=False, execution_environment="parallel"
        )
        before = [p.detach().clone() for p in model.parameters()]
        trained, _ = nbscale.train(model, data, options)
    assert all(not torch.equal(p, q) for p, q in zip(trained.parameters(), before, strict=True))
    assert [type(p).__name__ for p in trained.parameters()] == ["Parameter"] * 4
