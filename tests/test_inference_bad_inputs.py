"""classify / predict / accuracy / activations given what they cannot use: a clear error naming it, never a bare
IndexError, an empty tensor or nan."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbscale
from nbscale.data import ImageDatastore
from nbscale.errors import ModelError, NbscaleError
from tests.test_inference import digits, pixel_sum_net  # noqa: F401 - the module's fixture and network

EMPTY = TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("function", [nbscale.classify, nbscale.predict, nbscale.accuracy])
def test_empty_data_is_named_as_empty(function):
    with pytest.raises(NbscaleError, match=f"{function.__name__}: the data has no items"):
        function(pixel_sum_net(), EMPTY)


def test_an_empty_tensor_is_empty_data_too():
    with pytest.raises(NbscaleError, match="predict: the data has no items"):
        nbscale.predict(pixel_sum_net(), torch.zeros(0, 64))


def test_a_string_as_data_is_refused(digits: ImageDatastore):  # noqa: F811
    with pytest.raises(NbscaleError, match="predict: the data 'images/' is text.*ImageDatastore"):
        nbscale.predict(pixel_sum_net(), "images/")


def test_a_string_as_network_says_the_network_comes_first(digits: ImageDatastore):  # noqa: F811
    with pytest.raises(ModelError, match=r"classify: the network 'notanet' is a str, not a torch nn.Module"):
        nbscale.classify("notanet", digits)


def test_the_arguments_swapped_are_named(digits: ImageDatastore):  # noqa: F811
    with pytest.raises(ModelError, match="is a ImageDatastore, not a torch nn.Module"):
        nbscale.accuracy(digits, nn.Linear(64, 3))
