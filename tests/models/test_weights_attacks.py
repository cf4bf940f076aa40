"""pretrained(weights=file) as an attacker's file reaches it: nothing in the file runs, and the refusal names it."""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from nbscale.errors import ModelError
from nbscale.models import pretrained
from nbscale.models.weight_files import network_globals
from tests.crafted_pickles import Payload, in_torch_zip, prefix_trick


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "code-ran"


def _refused(path: Path, marker: Path, words: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about protocol 4 in the hand-made pickle
        with pytest.raises(ModelError) as caught:
            pretrained("resnet18", weights=path)
    assert not marker.exists(), "the file's code ran"
    assert words in str(caught.value)
    return str(caught.value)


def test_the_dotted_name_past_an_allowed_prefix_is_refused_without_running(tmp_path: Path, marker: Path) -> None:
    evil = tmp_path / "resnet18.pth"
    evil.write_bytes(in_torch_zip(prefix_trick(marker)))
    message = _refused(evil, marker, "'torch.nn.modules.module.torch.serialization.os.system'")
    assert "does not unpickle" in message and "state_dict" in message
    evil.write_bytes(prefix_trick(marker))  # the same pickle bare, as torch's legacy format reads it
    _refused(evil, marker, "torch.nn.modules.module.torch.serialization.os.system")


def test_a_reduce_payload_alone_or_inside_a_network_is_refused_without_running(tmp_path: Path, marker: Path) -> None:
    torch.save(Payload(marker), tmp_path / "payload.pt")
    _refused(tmp_path / "payload.pt", marker, "posix.system")
    network = torchvision.models.resnet18()
    network.fc.extra = Payload(marker)  # a real network carrying it in a layer's attributes
    torch.save(network, tmp_path / "network.pt")
    _refused(tmp_path / "network.pt", marker, "posix.system")
    network.fc.extra = functools.partial(os.system, f"touch {marker}")  # partial is allowed; what it wraps is not
    torch.save(network, tmp_path / "partial.pt")
    _refused(tmp_path / "partial.pt", marker, "posix.system")


def test_a_state_dict_loads_with_the_weights_only_loader(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = torchvision.models.resnet18()
    torch.save({"state_dict": saved.state_dict(), "epoch": 3, "note": "plain values pass"}, tmp_path / "w.pt")
    loaded = pretrained("resnet18", weights=tmp_path / "w.pt")
    assert torch.equal(loaded.fc.weight, saved.fc.weight)


def test_the_allow_list_is_layer_classes_and_a_few_named_helpers_only() -> None:
    allowed = network_globals()
    others = {key for key, value in allowed.items() if not (isinstance(value, type) and issubclass(value, nn.Module))}
    assert others == {
        ("functools", "partial"),
        ("torchvision.models.detection._utils", "BalancedPositiveNegativeSampler"),
        ("torchvision.models.detection._utils", "BoxCoder"),
        ("torchvision.models.detection._utils", "BoxLinearCoder"),
        ("torchvision.models.detection._utils", "Matcher"),
        ("torchvision.models.detection._utils", "SSDMatcher"),
        ("torchvision.models.optical_flow.raft", "_pass_through_h"),
        ("torchvision.ops.boxes", "box_iou"),
        ("nbscale.models.normalization", "normalize_inputs"),
    }  # pretrained(normalize=True)'s hook
    modules = {module for module, _ in allowed}
    assert all(
        m.startswith(("torch.nn.modules.", "torchvision.models.", "torchvision.ops.", "torch.ao."))
        for m in modules - {"functools", "nbscale.models.normalization"}
    )
    assert ("torch.nn.modules.module", "torch.serialization.os.system") not in allowed
    assert all(
        getattr(__import__(module, fromlist=["_"]), name.split(".")[0]) is not None for module, name in allowed
    )  # each pair is an exact, existing name


@pytest.mark.slow
def test_every_torchvision_network_saved_whole_loads_through_the_allow_list(tmp_path: Path) -> None:
    refused = []
    for name in torchvision.models.list_models():
        builder = torchvision.models.get_model_builder(name)
        extra = {"weights_backbone": None} if "weights_backbone" in inspect.signature(builder).parameters else {}
        if name.startswith("regnet") and not name.endswith("400mf"):
            continue  # every RegNet is made of the same classes; the large ones take minutes to build
        device = "cpu" if name.startswith("regnet") else "meta"  # RegNet's init cannot run on meta tensors
        with warnings.catch_warnings(), torch.device(device):
            warnings.simplefilter("ignore")
            network = torchvision.models.get_model(name, weights=None, **extra)
        path = tmp_path / f"{name}.pt"
        torch.save(network, path)
        try:
            loaded = pretrained(name, weights=path)
        except ModelError as error:
            refused.append(f"{name}: {error}")
            continue
        assert type(loaded) is type(network)
        path.unlink()
    assert refused == []
