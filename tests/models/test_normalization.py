"""pretrained(..., normalize=...): the network carries its weights' input normalization, as MATLAB's pretrained
networks do, through transfer, checkpoints, a pool and a whole-network file."""

from __future__ import annotations

import pickle

import pytest
import torch

import nbscale
from nbscale.errors import ModelError
from nbscale.models.normalization import Normalize

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> str:
    """resnet18 weights saved locally (no download): random, but a real torchvision state_dict."""
    import torchvision

    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    return str(path)


def test_a_local_weights_file_gets_the_architectures_default_normalization(weights_file: str) -> None:
    import torchvision

    net = nbscale.models.pretrained("resnet18", weights=weights_file).eval()
    assert isinstance(net.normalize, Normalize)
    assert net.normalize.mean.flatten().tolist() == pytest.approx(IMAGENET_MEAN)
    plain = torchvision.models.resnet18()
    plain.load_state_dict(net.state_dict())  # the weights file's keys only: loads both ways
    images = torch.rand(2, 3, 64, 64)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(net(images), plain.eval()((images - mean) / std))


def test_normalize_false_or_a_pair_or_random_weights(weights_file: str) -> None:
    assert not hasattr(nbscale.models.pretrained("resnet18", weights=weights_file, normalize=False), "normalize")
    assert not hasattr(nbscale.models.pretrained("resnet18", weights=None), "normalize")
    own = nbscale.models.pretrained("resnet18", weights=None, normalize=([0.5] * 3, [0.25] * 3))
    assert own.normalize.std.flatten().tolist() == [0.25] * 3
    with pytest.raises(ModelError, match="normalize must be True, False or a \\(mean, std\\) pair"):
        nbscale.models.pretrained("resnet18", weights=None, normalize="imagenet")
    with pytest.raises(ModelError, match="one mean and one std per channel"):
        nbscale.models.pretrained("resnet18", weights=None, normalize=([0.5] * 3, [0.25] * 2))


def test_the_normalization_survives_transfer_checkpoints_pickling_and_whole_network_files(weights_file, tmp_path):
    net = nbscale.models.transfer(
        nbscale.models.pretrained("resnet18", weights=weights_file),
        4,
        learn_rate_factor={"fc": 10, "layer4.*": 2},
        freeze=["conv1", "bn1"],
    )
    assert net.fc.out_features == 4 and isinstance(net.normalize, Normalize)
    factors = nbscale.models.learn_rate_factors(net)
    assert factors["fc"] == 10 and factors["layer4"] == 2 and factors["conv1"] == 0
    assert "normalize" not in factors
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected = net.eval()(images)
        copied = pickle.loads(pickle.dumps(net))  # what a pool or a job receives
        torch.testing.assert_close(copied.eval()(images), expected)
        again = nbscale.models.transfer(nbscale.models.pretrained("resnet18", weights=weights_file), 4)
        again.load_state_dict(net.state_dict())  # a checkpoint's state_dict
        torch.testing.assert_close(again.eval()(images), expected)
        whole = tmp_path / "whole.pt"
        torch.save(net, whole)  # a whole network, loaded without running code: its layer and hook are allowed
        loaded = nbscale.models.pretrained("resnet18", weights=str(whole))
        torch.testing.assert_close(loaded.eval()(images), expected)
        assert isinstance(loaded.normalize, Normalize)


@pytest.mark.slow
def test_a_normalized_network_trains_on_a_pool(weights_file) -> None:
    net = nbscale.models.transfer(nbscale.models.pretrained("resnet18", weights=weights_file), 2, freeze="trunk")
    images, labels = torch.rand(16, 3, 32, 32), torch.randint(0, 2, (16,))
    with nbscale.Pool(2, cpu=True) as pool:  # noqa: F841 - the running pool trains
        opts = nbscale.TrainingOptions(
            "sgdm", max_epochs=1, mini_batch_size=8, verbose=False, execution_environment="parallel"
        )
        trained, info = nbscale.train(net, (images, labels), opts)
    assert info.stop_reason == "Max epochs completed" and isinstance(trained.normalize, Normalize)
