"""Image files on a real CPU pool of 2 workers: read once in all (each worker a block, shared over gloo), held
whole by every worker, and trained on exactly as one process would."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import nbscale
from nbscale import TrainingOptions, WorkerError
from nbscale.data import AugmentedImageDatastore, ImageAugmenter, ImageDatastore
from nbscale.data.preparing import Readers
from tests.datasets import write_digits_pngs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """403 digits PNGs (an odd count: the second worker's block is shorter)."""
    folder = write_digits_pngs(tmp_path_factory.mktemp("pool-digits"), limit_per_class=40)
    for extra in sorted((folder / "9").iterdir())[:3]:
        (folder / "9" / f"copy-{extra.name}").write_bytes(extra.read_bytes())
    return folder


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def trained(data: object, validation: object, **fields: object) -> tuple[torch.nn.Module, nbscale.TrainingInfo]:
    options = TrainingOptions(
        "sgdm",
        initial_learn_rate=0.1,
        max_epochs=3,
        mini_batch_size=32,
        verbose=False,
        shuffle="every-epoch",
        validation_data=validation,
        validation_frequency=10,
        **fields,
    )
    torch.manual_seed(1)
    return nbscale.train(net(), data, options)


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(p, q, atol=1e-5) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_augmented_image_files_train_on_the_pool_like_one_process(pool: nbscale.Pool, digits_files: Path) -> None:
    train, val = ImageDatastore(digits_files).split_each_label(0.75, randomize=True, seed=0)
    augmenter = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-1, 1), rand_y_translation=(-1, 1))
    data, validation = AugmentedImageDatastore((8, 8), train, augmenter), AugmentedImageDatastore((8, 8), val)
    alone, alone_info = trained(data, validation)
    pooled, info = trained(data, validation, execution_environment="parallel")
    assert same(alone, pooled)  # every worker holds every image, in the same order as one process
    # each worker validates on its share; the shares add up to the whole validation set
    assert info.final_validation_accuracy == pytest.approx(alone_info.final_validation_accuracy, abs=1e-6)
    assert info.data_placement.startswith(
        f"device-resident ({len(train)} images, 0.0 MB on cpu) on each of 2 workers, which read 1/2 of it each"
    )
    assert alone_info.data_placement.startswith(f"device-resident ({len(train)} images")
    assert "workers" not in alone_info.data_placement


def test_augmented_image_files_streamed_in_background_train_alike_in_one_process_on_the_pool_and_held_whole(
    pool: nbscale.Pool, digits_files: Path
) -> None:
    """dispatch_in_background=True streams the files through DataLoader processes; each image still takes its
    random augmentation from the run's seed, the epoch and its index, so the run is the resident one's, on the pool
    too (each loader process drawing from its own random stream made every run differ)."""
    train = ImageDatastore(digits_files)
    augmenter = ImageAugmenter(rand_x_reflection=True, rand_x_translation=(-2, 2), rand_y_translation=(-2, 2))
    data = AugmentedImageDatastore((8, 8), train, augmenter)
    held, held_info = trained(data, None)
    streamed, streamed_info = trained(data, None, dispatch_in_background=True)
    pooled, pooled_info = trained(data, None, dispatch_in_background=True, execution_environment="parallel")
    assert streamed_info.data_placement.startswith("streamed by a DataLoader (")
    assert (
        pooled_info.data_placement.startswith("streamed by a DataLoader (")
        and "on each of 2" in pooled_info.data_placement
    )
    assert held_info.data_placement.startswith("device-resident")
    assert same(held, streamed) and same(held, pooled)
    assert streamed_info.training_loss == pytest.approx(held_info.training_loss, rel=1e-5)


def test_images_of_several_sizes_and_unreadable_files_are_left_out_on_the_pool_as_in_one_process(
    pool: nbscale.Pool, tmp_path: Path
) -> None:
    """The workers agree on one size for all images and leave out the same unreadable files as one process."""
    small = write_digits_pngs(tmp_path / "files", limit_per_class=12)
    write_digits_pngs(tmp_path / "large", limit_per_class=12, size=12)
    for large in sorted((tmp_path / "large").rglob("*.png")):
        large.rename(small / large.parent.name / f"large-{large.name}")
    (small / "2" / "zz-broken.png").write_bytes(b"not an image")
    (small / "8" / "zz-broken.png").write_bytes(b"not an image either")
    for mode in ("resize", "centercrop"):
        data = AugmentedImageDatastore((8, 8), ImageDatastore(small, on_error="skip"), output_size_mode=mode)
        with pytest.warns(UserWarning, match="Left out 2 unreadable"):
            alone, _ = trained(data, None)
        pooled, info = trained(data, None, execution_environment="parallel")
        assert same(alone, pooled), mode
        assert info.data_placement.startswith(f"device-resident ({len(data) - 2} images")


def test_an_unreadable_file_in_the_second_workers_block_is_named_and_nothing_hangs(
    pool: nbscale.Pool, tmp_path: Path
) -> None:
    folder = write_digits_pngs(tmp_path / "files", limit_per_class=6)
    (folder / "9" / "zz-broken.png").write_bytes(b"not an image")
    started = time.monotonic()
    with pytest.raises(WorkerError, match="zz-broken.png") as caught:
        trained(ImageDatastore(folder), None, execution_environment="parallel")
    assert str(caught.value).startswith("Training failed on worker 1 (worker 0 stopped with it).")
    assert time.monotonic() - started < 60
    (folder / "9" / "zz-broken.png").unlink()
    _, info = trained(ImageDatastore(folder), None, execution_environment="parallel")
    assert info.stop_reason == "Max epochs completed"  # the pool still works


def _gathered_on_worker(counts: list[int], dtype: torch.dtype, chunk_bytes: int) -> tuple[str, torch.Tensor]:
    from nbscale.pool.context import worker_context

    rank = worker_context().rank
    rows = (torch.arange(counts[rank] * 6).view(-1, 2, 3) + 1000 * rank).to(dtype)
    gathered = Readers(rank, 2, None, torch.device("cpu")).gather_rows(rows, counts, chunk_bytes=chunk_bytes)
    return str(gathered.dtype), gathered.long()  # torch cannot unpickle a uint16 tensor


@pytest.mark.parametrize("counts", [[5, 4], [4, 4], [3, 5], [0, 2]])
@pytest.mark.parametrize("dtype", [torch.uint16, torch.float16, torch.int64])
def test_workers_gather_every_rank_rows_in_rank_order_in_small_chunks(
    pool: nbscale.Pool, counts: list[int], dtype: torch.dtype
) -> None:
    expected = torch.cat(
        [(torch.arange(count * 6).view(-1, 2, 3) + 1000 * rank).to(dtype).long() for rank, count in enumerate(counts)]
    )
    for kind, result in pool.run(_gathered_on_worker, counts, dtype, 7):  # 7 bytes at a time: many collectives
        assert kind == str(dtype) and torch.equal(result, expected)


def test_each_reader_takes_one_block_and_the_blocks_cover_every_item_once() -> None:
    blocks = [Readers(position, 3, None, torch.device("cpu")).block(403) for position in range(3)]
    assert blocks == [range(0, 135), range(135, 270), range(270, 403)]
    assert [Readers(position, 4, None, torch.device("cpu")).block(2) for position in range(4)] == [
        range(0, 1),
        range(1, 2),
        range(2, 2),
        range(2, 2),
    ]


def test_a_datastore_of_a_relative_folder_trains_on_the_pool_after_the_notebook_changed_folder(
    pool: nbscale.Pool, digits_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(digits_files.parent)  # as %cd after %pool start: the workers stay where the pool started
    store = ImageDatastore(digits_files.name, label_source="foldernames")
    assert all(Path(file).is_absolute() for file in store.files)  # as MATLAB's Files: full paths
    monkeypatch.chdir("/")  # and a later change of folder does not lose them either
    _, info = nbscale.train(
        net(),
        store,
        TrainingOptions("sgdm", max_epochs=1, mini_batch_size=100, verbose=False, execution_environment="parallel"),
    )
    assert info.stop_reason == "Max epochs completed"
