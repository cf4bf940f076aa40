"""Learn-rate factors by layer name or glob pattern: set, listed per layer group, checked, and used by training."""

from __future__ import annotations

import ast
import re

import pytest
import torch
from torch import nn

import nbscale
from nbscale.errors import ModelError
from nbscale.models import (
    learn_rate_factors,
    pretrained,
    set_learn_rate_factor,
    set_learn_rate_factors,
    transfer,
)
from tests.kernel_session import REPO_ROOT
from tests.training.digits import digits, tiny_net


def test_transfer_takes_patterns_and_the_helper_lists_each_layer_groups_factor() -> None:
    model = transfer(
        pretrained("resnet18", weights=None),
        5,
        learn_rate_factor={"layer4.*": 2, "fc": 10},
        freeze=["conv1", "bn1", "layer1"],
    )
    assert learn_rate_factors(model) == {
        "conv1": 0.0,
        "bn1": 0.0,
        "layer1": 0.0,
        "layer2": 1.0,
        "layer3": 1.0,
        "layer4": 2.0,
        "fc": 10.0,
    }
    # a pattern for part of a layer splits that layer into its sub-layers
    set_learn_rate_factor(model, "layer3.1.*", 0.5)
    listed = learn_rate_factors(model)
    assert listed["layer3.0"] == 1.0 and listed["layer3.1"] == 0.5 and "layer3" not in listed


def test_later_patterns_win_and_the_new_layer_keeps_ten_unless_named() -> None:
    model = transfer(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3)),
        2,
        learn_rate_factor={"*": 0.1, "2": 3},
    )
    assert learn_rate_factors(model) == {"0": 0.1, "2": 3.0, "3": 0.1}  # "*" named the new layer too
    kept = transfer(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)), 2, learn_rate_factor={"0": 2})
    assert learn_rate_factors(kept) == {"0": 2.0, "1": 10.0}
    assert set_learn_rate_factor(kept, "?", 1) == ["0", "1"]  # returns the layers it matched


def test_a_pattern_that_matches_nothing_is_an_error_listing_the_layer_names() -> None:
    small = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(
        ModelError,
        match=r"The layer pattern 'fc\*' matches no layer of Sequential\. Its layers "
        r"are 0, 1, 2\. Name a layer as model\.named_modules\(\) does",
    ):
        set_learn_rate_factor(small, "fc*", 2)
    resnet = pretrained("resnet18", weights=None)
    with pytest.raises(
        ModelError,
        match=r"(?s)'layr4' matches no layer of ResNet\. Did you mean 'layer4'.*"
        r"top-level layers are conv1, bn1, relu, maxpool, layer1",
    ):
        transfer(resnet, 3, learn_rate_factor={"layr4": 2})
    with pytest.raises(ModelError, match="a learn-rate factor is a number >= 0"):
        set_learn_rate_factor(small, "0", -1)
    with pytest.raises(ModelError, match="a learn-rate factor is a number >= 0"):
        transfer(small, 3, learn_rate_factor="fast")
    with pytest.raises(ModelError, match="a dict of layer names or patterns"):
        set_learn_rate_factors(small, [("0", 2)])


def _moved(factors: dict[str, float], freeze: str | None = None) -> dict[str, float]:
    """How far each Linear of tiny_net moved in one epoch of training on digits with these factors."""
    torch.manual_seed(0)
    model = tiny_net()
    if freeze is not None:
        model = transfer(model, 10, learn_rate_factor=factors, freeze=freeze)
    else:
        set_learn_rate_factors(model, factors)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    (x, y), _ = digits()
    torch.manual_seed(1)
    nbscale.train(
        model,
        (x, y),
        nbscale.TrainingOptions(
            "sgdm", max_epochs=1, mini_batch_size=64, verbose=False, initial_learn_rate=0.005, plots="none"
        ),
    )
    return {
        layer: sum(float((p.detach() - before[n]).norm()) for n, p in model.named_parameters() if n.startswith(layer))
        for layer in ("0.", "2.")
    }


def test_training_uses_the_factors_zero_stays_put_ten_moves_more_frozen_stays_fixed() -> None:
    base = _moved({})
    assert base["0."] > 0 and base["2."] > 0
    patterned = _moved({"0*": 0, "2": 10})
    assert patterned["0."] == 0.0  # factor 0: not one weight moved
    assert patterned["2."] > 3 * base["2."]  # factor 10 moves it further
    frozen = _moved({"*": 10}, freeze="0")  # a frozen layer stays fixed whatever factor a pattern gives it
    assert frozen["0."] == 0.0 and frozen["2."] > 0


def test_the_data_page_lists_the_factors_its_own_transfer_example_gives() -> None:
    page = " ".join((REPO_ROOT / "docs" / "data.md").read_text().split())  # its code spans wrap across lines
    call = re.search(r"(transfer\(net, 5, learn_rate_factor=.*?\]\))", page).group(1)  # the page's code block
    listed = re.search(r"learn_rate_factors\(model\)` lists the factor of each layer group: `(\{.*?\})`", page).group(1)
    model = eval(
        call, {"transfer": transfer, "net": pretrained("resnet18", weights=None)}
    )  # eval: the call is our docs' own
    assert learn_rate_factors(model) == ast.literal_eval(listed)
