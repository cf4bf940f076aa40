"""pretrained(name, weights="DEFAULT" | a torchvision weights name or enum) in a notebook without internet.

Each test runs a real kernel whose HTTPS proxy is a loopback socket that accepts connections and never answers:
the worst case of a machine cut off from the internet (a firewall that drops packets), whatever this machine's
own network can reach.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torchvision

from nbscale.models.pretrained import FETCH_TIMEOUT_S
from tests.kernel_session import KernelSession


@pytest.fixture
def silent_proxy() -> Iterator[str]:
    """The address of a proxy that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.fixture
def offline_kernel(silent_proxy: str, tmp_path: Path) -> Iterator[KernelSession]:
    """A notebook kernel with no internet and an empty torchvision cache under tmp_path/torch."""
    kernel = KernelSession(
        cwd=tmp_path,
        env={
            "https_proxy": silent_proxy,
            "HTTPS_PROXY": silent_proxy,
            "no_proxy": "",
            "NO_PROXY": "",
            "TORCH_HOME": str(tmp_path / "torch"),
        },
    )
    kernel.run("import nbscale, time, torch, torchvision")
    yield kernel
    kernel.shutdown()


@pytest.mark.slow
def test_default_weights_without_internet_fail_quickly_with_the_fix(offline_kernel: KernelSession) -> None:
    started = offline_kernel.run("t = time.monotonic()")
    assert started.ok
    failed = offline_kernel.run(
        'net = nbscale.models.pretrained("resnet18", weights="DEFAULT")', timeout=FETCH_TIMEOUT_S + 60
    )
    elapsed = float(offline_kernel.run("print(time.monotonic() - t)").stdout)
    assert failed.error_name == "ModelError"
    assert "cannot fetch the ResNet18_Weights.IMAGENET1K_V1 weights of resnet18" in failed.error_value
    assert "weights=path" in failed.error_value and "resnet18-f37072fd.pth" in failed.error_value
    assert elapsed < FETCH_TIMEOUT_S + 30


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_weights_in_torchvisions_cache_load_offline_by_any_of_their_names(
    offline_kernel: KernelSession, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    cached = torchvision.models.resnet18()
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(cached.state_dict(), checkpoints / "resnet18-f37072fd.pth")
    torch.save(cached.state_dict(), tmp_path / "expected.pt")
    for weights in [
        '"DEFAULT"',
        '"IMAGENET1K_V1"',
        '"ResNet18_Weights.IMAGENET1K_V1"',
        "torchvision.models.ResNet18_Weights.DEFAULT",
    ]:
        loaded = offline_kernel.run(
            f"net = nbscale.models.pretrained('resnet18', weights={weights})\n"
            "print(torch.equal(net.fc.weight, torch.load('expected.pt')['fc.weight']))",
            timeout=60,
        )
        assert loaded.ok and loaded.stdout.strip() == "True", (weights, loaded.text)
    refit = offline_kernel.run('nbscale.models.pretrained("resnet18", weights="DEFAULT", num_classes=5)')
    assert refit.error_name == "ModelError"
    assert "nbscale.models.transfer(model, num_classes)" in refit.error_value


@pytest.mark.slow  # over 8 s (docs/development.md): make test runs it, make test-fast does not
def test_weights_that_are_not_the_networks_are_named_errors(offline_kernel: KernelSession) -> None:
    for weights, message in [
        ('"r18"', "its weights are ['DEFAULT', 'IMAGENET1K_V1']"),
        ('"ResNet18_Weights.NOPE"', "is not a torchvision weights name"),
        ("torchvision.models.VGG16_Weights.DEFAULT", "are not weights of resnet18"),
        ("3", "not int"),
    ]:
        failed = offline_kernel.run(f"nbscale.models.pretrained('resnet18', weights={weights})")
        assert failed.error_name == "ModelError", (weights, failed.text)
        assert message in failed.error_value, (weights, failed.error_value)
