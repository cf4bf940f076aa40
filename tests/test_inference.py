"""classify, predict, activations, accuracy and confusion_chart on a datastore, a tensor, and a tensor pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nbscale
from nbscale.data import ImageDatastore
from nbscale.errors import NbscaleError
from tests.datasets import write_digits_pngs


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> ImageDatastore:
    return ImageDatastore(write_digits_pngs(tmp_path_factory.mktemp("digits"), classes=[0, 1, 2], limit_per_class=20))


def pixel_sum_net() -> nn.Module:
    """A fixed network whose class-0 score is the pixel sum and whose other scores are 0."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    with torch.no_grad():
        net[1].weight.zero_()
        net[1].bias.zero_()
        net[1].weight[0] = 1.0
    return net


def test_classify_returns_class_names_and_softmax_scores(digits: ImageDatastore) -> None:
    labels, scores = nbscale.classify(pixel_sum_net(), digits, batch_size=7)
    assert isinstance(labels, np.ndarray) and labels.tolist() == ["0"] * len(digits)
    assert scores.shape == (60, 3) and torch.allclose(scores.sum(dim=1), torch.ones(60))


def test_classify_a_tensor_gives_indices() -> None:
    labels, _ = nbscale.classify(pixel_sum_net(), torch.rand(5, 1, 8, 8))
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.tolist() == [0] * 5


def test_classifys_labels_compare_elementwise_with_the_true_labels_as_matlabs_do(digits: ImageDatastore) -> None:
    predicted, scores = nbscale.classify(pixel_sum_net(), digits)
    assert (predicted == digits.labels).mean() == pytest.approx(1 / 3)  # MATLAB's mean(YPred == YValidation)
    assert isinstance(scores, torch.Tensor)
    indices, _ = nbscale.classify(pixel_sum_net(), torch.rand(4, 1, 8, 8))
    assert (indices == np.array([0, 0, 1, 0])).mean() == 0.75


def test_predict_returns_raw_outputs_in_order(digits: ImageDatastore) -> None:
    outputs = nbscale.predict(pixel_sum_net(), digits, batch_size=16)
    assert torch.allclose(outputs[:, 0], torch.stack([digits[i][0].sum() for i in range(60)]), atol=1e-4)


def test_accuracy_is_the_fraction_predicted_right(digits: ImageDatastore) -> None:
    assert nbscale.accuracy(pixel_sum_net(), digits) == pytest.approx(1 / 3)
    inputs = torch.rand(10, 1, 8, 8)
    assert nbscale.accuracy(pixel_sum_net(), (inputs, torch.tensor([0] * 5 + [2] * 5))) == pytest.approx(0.5)
    with pytest.raises(NbscaleError, match="labelled data"):
        nbscale.accuracy(pixel_sum_net(), inputs)


def test_inputs_and_labels_as_numpy_arrays_or_lists_are_a_labelled_pair() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images[:10, None] / 16.0  # numpy float64, N x 1 x 8 x 8
    labels = [0] * 5 + [2] * 5
    for pair in ((images, labels), (images, np.array(labels)), [torch.from_numpy(images).float(), labels]):
        assert nbscale.accuracy(pixel_sum_net(), pair) == pytest.approx(0.5)
        assert nbscale.classify(pixel_sum_net(), pair)[0].tolist() == [0] * 10
    assert nbscale.predict(pixel_sum_net(), images).shape == (10, 3)
    column = np.array(labels)[:, None]  # N x 1, as numpy and pandas often give labels (train takes them too)
    assert nbscale.accuracy(pixel_sum_net(), (images, column)) == pytest.approx(0.5)
    with pytest.raises(NbscaleError, match="one label per input"):
        nbscale.accuracy(pixel_sum_net(), (images, labels[:3]))
    with pytest.raises(NbscaleError, match="tuple of 3 items"):
        nbscale.predict(pixel_sum_net(), (images, labels, labels))


def test_activations_of_a_named_layer_and_the_mode_is_restored(digits: ImageDatastore) -> None:
    net = pixel_sum_net().train()
    flat = nbscale.activations(net, digits, layer="0")
    assert flat.shape == (60, 64) and torch.allclose(flat[3], digits[3][0].flatten())
    assert net.training
    with pytest.raises(nbscale.ModelError, match="no layer 'layer4'"):  # a ValueError, as for transfer's layer names
        nbscale.activations(net, digits)


def test_confusion_chart_counts_and_displays(tmp_path: Path) -> None:
    chart = nbscale.confusion_chart(["cat", "dog", "dog", "cat"], ["cat", "dog", "cat", "cat"])
    assert chart.classes == ["cat", "dog"] and chart.matrix.tolist() == [[2, 0], [1, 1]]
    assert "true \\ predicted" in repr(chart)
    assert chart._repr_png_().startswith(b"\x89PNG")
    by_index = nbscale.confusion_chart(torch.tensor([0, 2]), torch.tensor([2, 2]), classes=["a", "b", "c"])
    assert by_index.matrix[0, 2] == 1 and by_index.matrix[2, 2] == 1


def test_confusion_chart_of_indices_against_names_needs_the_classes() -> None:
    true_indices, predicted_names = [0, 1, 1], ["cat", "dog", "cat"]  # ds[i][1] against classify()'s names
    with pytest.raises(NbscaleError, match="mix class names and class indices; pass classes="):
        nbscale.confusion_chart(true_indices, predicted_names)
    chart = nbscale.confusion_chart(true_indices, predicted_names, classes=["cat", "dog"])
    assert chart.matrix.tolist() == [[1, 0], [1, 1]]


def test_classify_a_trained_network_on_held_out_digits(tmp_path: Path) -> None:
    ds = ImageDatastore(write_digits_pngs(tmp_path, classes=[0, 1], limit_per_class=40))
    train, test = ds.split_each_label(0.5, randomize=True, seed=0)
    from nbscale.data.device_resident import DeviceResidentData

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(20):
        for images, labels in DeviceResidentData(train, torch.device("cpu")).batches(40, shuffle=True):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
    labels, _ = nbscale.classify(net, test)
    assert sum(a == b for a, b in zip(labels, test.labels, strict=True)) / len(test) > 0.9
    assert nbscale.accuracy(net, test) > 0.9


def test_confusion_chart_of_100k_labels_counts_each_pair_like_a_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    true = torch.randint(0, 10, (100_000,), generator=generator)
    predicted = torch.where(
        torch.rand(100_000, generator=generator) < 0.8, true, torch.randint(0, 10, (100_000,), generator=generator)
    )
    expected = torch.zeros(10, 10, dtype=torch.long)
    for t, p in zip(true.tolist(), predicted.tolist(), strict=True):
        expected[t, p] += 1
    names = [str(i) for i in range(10)]
    for given in (
        (true, predicted),
        (true.numpy(), predicted.numpy()),
        (true.tolist(), predicted.tolist()),
        ([names[i] for i in true.tolist()], [names[i] for i in predicted.tolist()]),
    ):
        chart = nbscale.confusion_chart(*given)
        assert torch.equal(chart.matrix, expected) and chart.classes == names
    with pytest.raises(NbscaleError, match="label index 10 is outside the 10 classes"):
        nbscale.confusion_chart(torch.tensor([0, 10]), torch.tensor([0, 1]), classes=names)


def test_grayscale_images_into_a_colour_network_are_an_error_naming_the_conversion(digits: ImageDatastore) -> None:
    from nbscale.data import AugmentedImageDatastore
    from nbscale.errors import ModelError

    colour_net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    for use in (nbscale.classify, nbscale.predict, nbscale.accuracy):
        with pytest.raises(
            ModelError,
            match=r"takes 3-channel images but the data has 1 channel\(s\) \(inputs of "
            r"shape \[60, 1, 8, 8\]\)\. AugmentedImageDatastore\(output_size, ds, "
            r"color_preprocessing='gray2rgb'\)",
        ):
            use(colour_net, digits)
    labels, _ = nbscale.classify(colour_net, AugmentedImageDatastore((8, 8, 3), digits))
    assert len(labels) == len(digits)
    with pytest.raises(ModelError, match="color_preprocessing='rgb2gray'"):
        nbscale.activations(nn.Conv2d(1, 2, 3), torch.rand(2, 3, 8, 8), layer="")


def test_a_network_that_does_not_fit_the_data_is_a_model_error_giving_torchs_message_and_the_shape(
    digits: ImageDatastore,
) -> None:
    from nbscale.errors import ModelError

    misfit = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    for use in (
        nbscale.classify,
        nbscale.predict,
        nbscale.accuracy,
        lambda net, data: nbscale.activations(net, data, layer="1"),
    ):
        with pytest.raises(ModelError) as raised:
            use(misfit, digits)
        message = str(raised.value)
        assert message.startswith(
            "The first batch failed in the network: RuntimeError: mat1 and mat2 shapes cannot "
            "be multiplied (60x64 and 3x2). The batch's inputs are a torch.float32 tensor of "
            "shape 60x1x8x8. Check that the network's first layer takes inputs of that shape"
        )
        assert isinstance(raised.value.__cause__, RuntimeError)  # torch's own, with its traceback into forward


class FailsOnSecondBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the network's own failure")
        return inputs.flatten(1)


def test_a_failure_after_the_first_batch_reaches_the_user_as_it_is() -> None:
    with pytest.raises(RuntimeError, match="the network's own failure"):
        nbscale.predict(FailsOnSecondBatch(), torch.rand(10, 4), batch_size=5)


def conv_net() -> nn.Module:
    """A small colour-image classifier with batch norm (which refuses an unbatched image) and 4 classes."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4)
    )


def test_a_single_image_is_classified_as_a_batch_of_one() -> None:
    net, images = conv_net(), torch.rand(5, 3, 8, 8)
    labels, scores = nbscale.classify(net, images[2])  # C x H x W, as ds[i][0] gives it
    assert labels.tolist() == [int(nbscale.predict(net, images)[2].argmax())] and scores.shape == (1, 4)
    assert torch.allclose(nbscale.predict(net, images[2].numpy()), nbscale.predict(net, images)[2:3], atol=1e-6)
    assert nbscale.activations(net, images[2], layer="1").shape == (1, 4, 6, 6)
    gray = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 3))
    assert nbscale.predict(gray, torch.rand(8, 8)).shape == (1, 3)  # H x W: one grayscale image


def test_a_dataloader_is_read_batch_by_batch() -> None:
    net, images, labels = conv_net(), torch.rand(10, 3, 8, 8), torch.arange(10) % 4
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=3)
    assert torch.allclose(nbscale.predict(net, loader), nbscale.predict(net, images), atol=1e-6)
    assert nbscale.accuracy(net, loader) == nbscale.accuracy(net, (images, labels))
    assert np.array_equal(nbscale.classify(net, loader)[0], nbscale.classify(net, images)[0])


def test_activations_of_a_layer_the_network_lacks_names_the_close_ones() -> None:
    import torchvision

    with pytest.raises(NbscaleError) as caught:
        nbscale.activations(torchvision.models.resnet18(), torch.rand(1, 3, 32, 32), layer="layer4.1.con1")
    message = str(caught.value)
    assert "no layer 'layer4.1.con1'. Did you mean 'layer4.1.conv1', 'layer4.1.conv2'" in message
    assert "Its top-level layers are conv1, bn1, relu, maxpool, layer1, layer2, layer3, layer4, avgpool, fc" in message
