"""pretrained() from a local file or none, transfer() on torchvision networks, and the optimizer groups."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from nbscale.errors import ModelError
from nbscale.models import param_groups, pretrained, set_learn_rate_factor, transfer


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    torch.manual_seed(0)
    model = pretrained("resnet18", weights=None)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(model.state_dict(), path)
    return model, path


def test_weights_from_a_local_file_are_loaded(resnet18_file: tuple[nn.Module, Path]) -> None:
    saved, path = resnet18_file
    loaded = pretrained("resnet18", weights=path)
    assert all(
        torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values(), strict=True)
    )
    assert isinstance(pretrained("resnet18", weights=str(path)), nn.Module)


def test_missing_file_unknown_name_and_mismatched_weights_are_clear_errors(
    resnet18_file: tuple[nn.Module, Path], tmp_path: Path
) -> None:
    with pytest.raises(ModelError, match="does not exist") as missing:
        pretrained("resnet18", weights=tmp_path / "nope.pth")
    assert "nope.pth" in str(missing.value)
    with pytest.raises(ModelError, match=r"'resnet81' is not a torchvision network\. Did you mean 'resnet18'"):
        pretrained("resnet81", weights=None)
    with pytest.raises(ModelError, match="do not fit resnet34"):
        pretrained("resnet34", weights=resnet18_file[1])
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="cannot read weights file"):
        pretrained("resnet18", weights=garbage)


def test_weights_of_another_network_are_a_short_error_counting_and_naming_a_few_parameters(
    resnet18_file: tuple[nn.Module, Path], tmp_path: Path
) -> None:
    torch.save(pretrained("mobilenet_v3_small", weights=None).state_dict(), tmp_path / "mobilenet.pt")
    with pytest.raises(ModelError) as caught:
        pretrained("resnet18", weights=tmp_path / "mobilenet.pt")
    message = str(caught.value)
    assert re.search(
        r"do not fit resnet18: it lacks: conv1.weight, bn1.weight, bn1.bias, \.\.\. \(\d+ in all\)", message
    )
    assert "it has parameters the network does not: features.0.0.weight" in message
    assert len(message) < 600  # one paragraph, not torch's list of every key
    with pytest.raises(ModelError, match="is a folder; weights= takes the file in it"):
        pretrained("resnet18", weights=tmp_path)


def test_a_whole_saved_network_of_another_architecture_is_refused(
    resnet18_file: tuple[nn.Module, Path], tmp_path: Path
) -> None:
    torch.save(resnet18_file[0], tmp_path / "resnet18_whole.pt")
    torch.save(pretrained("mobilenet_v3_small", weights=None), tmp_path / "mobilenet_whole.pt")
    with pytest.raises(ModelError, match=r"holds a whole MobileNetV3 network, not resnet18 \(a ResNet\)"):
        pretrained("resnet18", weights=tmp_path / "mobilenet_whole.pt")
    with pytest.raises(ModelError, match=r"holds a ResNet that is not resnet34: it lacks: layer1.2.conv1.weight"):
        pretrained("resnet34", weights=tmp_path / "resnet18_whole.pt")
    five = transfer(pretrained("resnet18", weights=None), 5)  # only the classification layer differs: it loads
    torch.save(five, tmp_path / "five_whole.pt")
    assert pretrained("resnet18", weights=tmp_path / "five_whole.pt").fc.out_features == 5


class NotTorchvision(nn.Module):
    """A network class of the user's own: nbscale does not unpickle it (that would run the user's code)."""


def test_whole_networks_ddp_names_and_transferred_heads_load_from_a_file(
    resnet18_file: tuple[nn.Module, Path], tmp_path: Path
) -> None:
    saved, _ = resnet18_file
    torch.save(saved, tmp_path / "whole.pt")  # torch.save(model, path), not its state_dict
    assert torch.equal(pretrained("resnet18", weights=tmp_path / "whole.pt").fc.weight, saved.fc.weight)
    torch.save({"module." + k: v for k, v in saved.state_dict().items()}, tmp_path / "ddp.pt")
    assert torch.equal(pretrained("resnet18", weights=tmp_path / "ddp.pt").conv1.weight, saved.conv1.weight)
    transferred = transfer(pretrained("resnet18", weights=None), 5)
    torch.save(transferred.state_dict(), tmp_path / "five.pt")
    loaded = pretrained("resnet18", weights=tmp_path / "five.pt")  # the file's 5 classes, no num_classes= needed
    assert loaded.fc.out_features == 5 and torch.equal(loaded.fc.weight, transferred.fc.weight)
    torch.save(NotTorchvision(), tmp_path / "other.pt")
    with pytest.raises(ModelError, match="(?s)NotTorchvision.*weights_only=False"):
        pretrained("resnet18", weights=tmp_path / "other.pt")


def test_transfer_replaces_fc_freezes_the_trunk_and_records_the_factor(resnet18_file: tuple[nn.Module, Path]) -> None:
    model = transfer(pretrained("resnet18", weights=resnet18_file[1]), 7, learn_rate_factor=10.0, freeze="trunk")
    assert model.fc.out_features == 7
    assert model.nbscale_learn_rate_factors == {"fc.weight": 10.0, "fc.bias": 10.0}
    assert not model.conv1.weight.requires_grad and model.fc.weight.requires_grad
    groups = param_groups(model, base_lr=0.01)
    assert len(groups) == 1 and groups[0]["lr"] == pytest.approx(0.1)
    assert {id(p) for p in groups[0]["params"]} == {id(model.fc.weight), id(model.fc.bias)}
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.parametrize(("name", "head"), [("mobilenet_v3_small", "classifier.3"), ("alexnet", "classifier.6")])
def test_transfer_finds_the_classifier_of_other_families(name: str, head: str) -> None:
    model = transfer(pretrained(name, weights=None), 3, freeze=["features"])
    assert model.get_submodule(head).out_features == 3
    factors = {group["learn_rate_factor"]: len(group["params"]) for group in param_groups(model, 1.0)}
    assert factors[10.0] == 2 and 1.0 in factors  # new layer fast, unfrozen middle layers at the base rate
    assert not any(p.requires_grad for p in model.features.parameters())


def test_transfer_replaces_squeezenets_class_scoring_convolution() -> None:
    model = transfer(pretrained("squeezenet1_1", weights=None), 4, freeze="trunk")
    head = model.classifier[1]
    assert isinstance(head, nn.Conv2d) and head.out_channels == 4 and head.kernel_size == (1, 1)
    assert model.nbscale_learn_rate_factors == {"classifier.1.weight": 10.0, "classifier.1.bias": 10.0}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["classifier.1.weight", "classifier.1.bias"]
    assert model.eval()(torch.rand(2, 3, 64, 64)).shape == (2, 4)


def test_freezing_the_trunk_of_a_long_sequential_names_every_layer_but_the_head() -> None:
    layers = [nn.Linear(4, 4) for _ in range(11)] + [nn.Linear(4, 3)]  # the head is "11", which starts with "1"
    model = transfer(nn.Sequential(*layers), 2, freeze="trunk")
    assert "1" in model.nbscale_frozen_layers and "11" not in model.nbscale_frozen_layers
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["11.weight", "11.bias"]


def test_transfer_takes_the_last_linear_of_any_network_and_names_unknown_layers() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    transfer(model, 5, learn_rate_factor=3.0, freeze="1")
    assert model[3].out_features == 5 and not model[1].weight.requires_grad
    with pytest.raises(ModelError, match="layer4"):
        transfer(model, 5, freeze=["layer4"])
    with pytest.raises(ModelError, match="no nn.Linear"):
        transfer(nn.Sequential(nn.Conv2d(1, 1, 1)), 2)


def test_freezing_an_unknown_layer_names_it_with_close_names_and_the_layers_in_one_paragraph() -> None:
    resnet = pretrained("resnet18", weights=None)
    with pytest.raises(ModelError) as raised:
        transfer(resnet, 3, freeze=["conv1", "layer9"])
    message = str(raised.value)
    assert message.startswith("transfer: freeze names 'layer9', which is no layer of ResNet. Did you mean 'layer")
    assert "Its top-level layers are conv1, bn1, relu, maxpool, layer1, layer2, layer3, layer4, avgpool, fc" in message
    assert "freeze='trunk'" in message and "['" not in message and "\n" not in message  # no Python list
    small = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(
        ModelError,
        match=r"freeze names 'fc1', which is no layer of Sequential\. Its layers are 0, "
        r"1, 2\. Name layers as model\.named_modules\(\) does",
    ):
        transfer(small, 3, freeze="fc1")


def test_set_learn_rate_factor_and_factors_survive_pickling() -> None:
    import pickle

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    set_learn_rate_factor(model, "0", 0.0)
    set_learn_rate_factor(model, "1", 2.0)
    copy = pickle.loads(pickle.dumps(model))
    groups = param_groups(copy, 0.5)
    assert [(g["lr"], len(g["params"])) for g in groups] == [(1.0, 2)]


def test_a_network_with_auxiliary_outputs_trains_and_classifies_on_its_logits() -> None:
    import nbscale

    net = pretrained("googlenet", weights=None, aux_logits=True, num_classes=3, init_weights=False)
    inputs, labels = torch.rand(16, 3, 64, 64), torch.arange(16) % 3
    net.train()
    assert hasattr(net(inputs[:2]), "logits")  # (logits, aux_logits2, aux_logits1) in training mode
    options = nbscale.TrainingOptions("sgdm", max_epochs=2, mini_batch_size=8, verbose=False, plots="none")
    net, info = nbscale.train(net, (inputs, labels), options)
    assert len(info.training_loss) == 4 and all(0.0 <= a <= 1.0 for a in info.training_accuracy)
    predicted, scores = nbscale.classify(net, (inputs, labels))
    assert scores.shape == (16, 3) and len(predicted) == 16
