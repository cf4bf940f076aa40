"""A DataLoader's worker settings are followed (nbscale.data.streaming): a dataset that opens its file in the
loader's worker_init_fn trains, with persistent workers, exactly as a plain loop over the same loader; a hung
loader worker ends training at the loader's timeout."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import nbscale
from nbscale import TrainingOptions
from tests.reference.plain import assert_same, classes, nbscale_history, network, plain_loop

pytestmark = pytest.mark.slow


class OpenedInWorkers(Dataset):
    """Samples kept in a file that each loader worker opens (in worker_init_fn); unopened, reading fails."""

    def __init__(self, path: Path) -> None:
        self.path, self.tensors = path, None

    def open(self) -> None:
        self.tensors = torch.load(self.path)

    def __len__(self) -> int:
        return 38

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = self.tensors  # a TypeError where worker_init_fn did not run
        return inputs[index], labels[index]


def open_in_worker(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.open()


class HangsAtFive(Dataset):
    def __len__(self) -> int:
        return 38

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 5:
            threading.Event().wait()  # a read that never ends (a stuck network file system)
        return torch.zeros(6), 0


def sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)  # type: ignore[arg-type]


def test_a_dataset_opened_in_worker_init_fn_trains_as_a_plain_loop_with_persistent_workers(tmp_path: Path) -> None:
    torch.save(classes().tensors, tmp_path / "samples.pt")

    def loader() -> DataLoader:
        return DataLoader(
            OpenedInWorkers(tmp_path / "samples.pt"),
            8,
            shuffle=True,
            generator=torch.Generator().manual_seed(2),
            num_workers=2,
            worker_init_fn=open_in_worker,
            persistent_workers=True,
        )

    plain = network()
    expected = plain_loop(plain, loader(), 3, sgd(plain.parameters()))
    net, info = nbscale.train(network(), loader(), TrainingOptions(sgd, max_epochs=3, verbose=False))
    assert info.data_placement.startswith("streamed by a DataLoader (2 background workers)")
    assert_same(nbscale_history(net, info), expected)


def test_a_hung_loader_worker_ends_training_at_the_loaders_timeout() -> None:
    loader = DataLoader(HangsAtFive(), 8, num_workers=1, timeout=3)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 3 seconds"):
        nbscale.train(network(), loader, TrainingOptions(sgd, max_epochs=1, verbose=False))
