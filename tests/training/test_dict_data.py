"""A dict as train_data or validation_data is refused before training with one line naming its keys and the fix."""

from __future__ import annotations

import pytest

import nbscale
from nbscale import OptionsError, TrainingOptions
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()


@pytest.mark.parametrize("what", ["train_data", "validation_data"])
def test_a_dict_of_inputs_and_labels_is_refused_naming_its_keys(what: str) -> None:
    data = {"images": TRAIN[0], "labels": TRAIN[1]}
    train_data, validation = (data, None) if what == "train_data" else (TRAIN, data)
    options = TrainingOptions("sgdm", max_epochs=1, mini_batch_size=100, verbose=False, validation_data=validation)
    with pytest.raises(OptionsError) as caught:
        nbscale.train(tiny_net(), train_data, options)
    assert str(caught.value) == (
        f"{what} is a dict (keys 'images', 'labels'), not samples: give (inputs, labels) as a tuple, e.g. "
        f"({what}['images'], {what}['labels']), or a torch Dataset yielding (input, label)."
    )


def test_an_empty_dict_is_refused_too() -> None:
    with pytest.raises(OptionsError, match=r"train_data is a dict \(keys none\), not samples: give \(inputs, labels\)"):
        nbscale.train(tiny_net(), {}, TrainingOptions("sgdm", max_epochs=1, verbose=False))
