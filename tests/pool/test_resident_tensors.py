"""Notebook tensors reach a local pool's workers once: kept in shared memory while unchanged (nbscale.pool.resident).

The pool's shared-memory folder is a private folder of the test (NBSCALE_SHM_DIR, tests/pool/conftest.py's `shm`),
so its files can be counted.
"""

from __future__ import annotations

import gc

import torch
from torch.utils.data import DataLoader, TensorDataset

import nbscale
from nbscale.pool import resident

MIB = 2**20


def _files(folder):
    return sorted(path.name for path in folder.iterdir())


def _inode_seen(data):
    """On the worker: the byte address its copy of `data` starts at (the same between calls when the mapping is)."""
    return data.data_ptr()


def test_a_tensor_sent_twice_is_written_once_and_mapped_once_per_worker(shm):
    data = torch.randint(0, 1000, (2 * MIB,))  # 16 MiB of int64 (sums exact in any order)
    with nbscale.Pool(2, cpu=True) as pool:
        first = pool.run(_inode_seen, data)
        files = _files(shm)
        assert len(files) == 1  # kept for the next call
        # a mapping is reused once no value of an earlier message uses it: a worker may read the next message while
        # it still lets go of the last one's arguments, so one call comes between (nbscale.pool.mappings)
        pool.run(len, [])
        second = pool.run(_inode_seen, data)
        assert _files(shm) == files  # not written again
        assert second == first  # each worker reused its mapping
        assert [int(total) for total in pool.run(torch.sum, data)] == [int(data.sum())] * 2
    assert _files(shm) == []  # the pool stopped: the kept file went


def test_a_tensor_changed_in_place_is_sent_again_and_never_read_stale(shm):
    data = torch.zeros(4 * MIB)
    with nbscale.Pool(1, cpu=True) as pool:
        assert pool.run(torch.sum, data) == [0.0]
        before = _files(shm)
        data += 1  # in place: the same object and data pointer, a new version
        assert pool.run(torch.sum, data) == [float(4 * MIB)]
        view = data[:MIB]
        view.fill_(2)  # through a view: the version counter is shared
        assert pool.run(torch.sum, data) == [float(2 * MIB + 3 * MIB)]
        after = _files(shm)
        assert len(after) == 1 and after != before  # the stale file went once no message named it


def test_a_worker_writing_to_its_copy_changes_neither_the_notebook_nor_its_next_call(shm):
    data = torch.ones(4 * MIB)

    def zero_and_sum(tensor):
        total = float(tensor.sum())
        tensor.zero_()
        return total

    with nbscale.Pool(1, cpu=True) as pool:
        assert pool.run(zero_and_sum, data) == [float(4 * MIB)]
        assert pool.run(zero_and_sum, data) == [float(4 * MIB)]  # a fresh mapping, not its own zeros
    assert float(data.sum()) == 4 * MIB


def test_a_dataset_and_a_loader_over_it_are_kept_and_released_when_the_notebook_drops_them(shm):
    images, labels = torch.randn(2048, 1024), torch.randint(0, 10, (2048,))  # 8 MiB of images, small labels
    dataset = TensorDataset(images, labels)
    loader = DataLoader(dataset, batch_size=64)

    def count(loader_or_dataset):
        return sum(1 for _ in loader_or_dataset)

    with nbscale.Pool(1, cpu=True) as pool:
        assert pool.run(count, dataset) == [2048]
        kept = _files(shm)
        assert len(kept) == 1  # the images; the labels are small enough to go inline
        assert pool.run(count, loader) == [32]
        assert _files(shm) == kept
        del dataset, loader, images
        gc.collect()
        assert _files(shm) == []
        assert resident.kept_bytes() == 0


def test_a_pushed_tensor_stays_readable_though_the_notebook_dropped_it_at_once(shm):
    with nbscale.Pool(2, cpu=True) as pool:
        pool.push(x=torch.full((4 * MIB,), 3.0))  # a temporary: dropped while the push is on its way
        assert [float(v.sum()) for v in pool.pull("x")] == [3.0 * 4 * MIB] * 2
        assert _files(shm) == []
