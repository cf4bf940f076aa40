"""Checkpoint files as an attacker or a crash leaves them: nothing in them runs, folders others can write are
refused, partial files of killed writes are cleaned, and checkpoints of the earlier format still resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

import nbscale
from nbscale import OptionsError, TrainingOptions
from nbscale.training.checkpoint import STALE_PARTIAL_S, checkpoint_file
from tests.crafted_pickles import checkpoint_with_payload, in_torch_zip, prefix_trick
from tests.training.digits import digits, tiny_net

TRAIN, _ = digits()
NOBODY = 65534


def quiet(**fields: object) -> TrainingOptions:
    base = {"initial_learn_rate": 0.1, "max_epochs": 1, "mini_batch_size": 100, "verbose": False}
    return TrainingOptions("sgdm", **{**base, **fields})


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "code-ran"


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """The checkpoint folder of a real 2-epoch run."""
    folder = tmp_path / "checkpoints"
    nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2, checkpoint_path=str(folder)))
    return folder


def _resume_refused(resume_from: Path, marker: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about protocol 4 in the hand-made pickle
        with pytest.raises(OptionsError) as caught:
            nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=resume_from)
    assert not marker.exists(), "the checkpoint's code ran"
    return str(caught.value)


def test_a_reduce_payload_in_a_checkpoint_is_refused_without_running(run_folder: Path, marker: Path) -> None:
    torch.save(checkpoint_with_payload(marker), checkpoint_file(run_folder, 9))
    message = _resume_refused(run_folder, marker)
    assert "refers to ['posix.system'], which nbscale does not unpickle" in message
    assert "train from the start without resume_from" in message


def test_a_hand_built_global_pickle_is_refused_without_running(run_folder: Path, marker: Path) -> None:
    planted = checkpoint_file(run_folder, 9)
    planted.write_bytes(in_torch_zip(prefix_trick(marker)))
    assert "torch.nn.modules.module.torch.serialization.os.system" in _resume_refused(planted, marker)
    planted.write_bytes(prefix_trick(marker))  # bare, as torch's legacy format reads it
    assert "torch.nn.modules.module.torch.serialization.os.system" in _resume_refused(planted, marker)


def test_a_folder_others_can_write_is_refused_before_its_newest_file_is_read(run_folder: Path, marker: Path) -> None:
    run_folder.chmod(0o777)
    torch.save(checkpoint_with_payload(marker), checkpoint_file(run_folder, 9))  # planted "newest" checkpoint
    message = _resume_refused(run_folder, marker)
    assert f"the folder '{run_folder}' can be written by other users (mode drwxrwxrwx)" in message
    assert f"chmod go-w '{run_folder}'" in message
    run_folder.chmod(0o1777)  # sticky: others cannot replace files, but can still add the newest one
    assert "can be written by other users" in _resume_refused(run_folder, marker)


def test_a_checkpoint_file_others_can_write_is_refused(run_folder: Path, marker: Path) -> None:
    last = checkpoint_file(run_folder, 2)
    last.chmod(0o666)
    message = _resume_refused(last, marker)
    assert f"the file '{last}' can be written by other users (mode -rw-rw-rw-)" in message
    assert "can be written by other users" in _resume_refused(run_folder, marker)  # the folder's newest


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user takes root")
def test_files_and_folders_of_another_user_are_refused(run_folder: Path, marker: Path) -> None:
    last = checkpoint_file(run_folder, 2)
    os.chown(last, NOBODY, -1)
    assert f"the file '{last}' belongs to another user (uid {NOBODY})" in _resume_refused(run_folder, marker)
    os.chown(last, 0, -1)
    os.chown(run_folder, NOBODY, -1)
    assert f"the folder '{run_folder}' belongs to another user (uid {NOBODY})" in _resume_refused(run_folder, marker)
    assert "belongs to another user" in _resume_refused(last, marker)  # a file named directly: its folder too


def test_a_checkpoint_named_directly_in_a_sticky_shared_folder_resumes(run_folder: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot rename or remove this user's 0600 file
    copy = shared / "mine.pt"
    copy.write_bytes(checkpoint_file(run_folder, 2).read_bytes())
    copy.chmod(0o600)
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=copy)
    assert info.epoch[-1] == 3 and info.epoch[0] == 1


def test_a_checkpoint_path_others_can_write_is_refused_before_training(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(OptionsError, match=r"checkpoint_path='.*open': the folder .* can be written by other users"):
        nbscale.train(tiny_net(), TRAIN, quiet(checkpoint_path=str(folder)))
    assert list(folder.iterdir()) == []


def test_checkpoint_folders_and_files_are_the_users_only(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "checkpoints"
    nbscale.train(tiny_net(), TRAIN, quiet(checkpoint_path=folder))  # a Path, as docs/jobs.md writes it
    assert folder.stat().st_mode & 0o777 == 0o700
    assert [oct(p.stat().st_mode & 0o777) for p in folder.iterdir()] == ["0o600"]


def test_a_checkpoint_written_the_earlier_way_still_resumes(run_folder: Path, tmp_path: Path) -> None:
    """Earlier versions pickled the options as given (a Path as a PosixPath) beside the history entries."""
    state = torch.load(checkpoint_file(run_folder, 2), weights_only=False)  # our own file: trusted here
    state["options"]["checkpoint_path"] = run_folder  # a PosixPath, as the earlier version kept it
    assert type(state["history"][0]).__module__ == "nbscale.training.events"
    earlier = tmp_path / "earlier"
    earlier.mkdir(mode=0o700)
    with open(checkpoint_file(earlier, 2), "wb") as stream:  # torch.save as the earlier save_checkpoint called it
        torch.save(state, stream)
    assert b"PosixPath" in _data_pickle(checkpoint_file(earlier, 2))
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=earlier)
    assert info.epoch[-1] == 3 and len(info.iteration) == 3 * 15


def _data_pickle(path: Path) -> bytes:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))


# ---- partial files of killed writes ---------------------------------------------------------------------------

_STUCK_WRITER = textwrap.dedent("""
    import sys, time
    from nbscale.training.checkpoint import save_checkpoint

    class Stuck:  # pickling it never ends: the write stays mid-file, as a kill mid-write leaves it
        def __reduce__(self):
            print("writing", flush=True)
            time.sleep(600)

    save_checkpoint(sys.argv[1], 5, {"model": {}, "stuck": Stuck()})
""")


def _start_stuck_writer(folder: Path) -> subprocess.Popen:
    writer = subprocess.Popen([sys.executable, "-c", _STUCK_WRITER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    return writer


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".partial-*"))


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.slow
def test_partial_files_of_killed_writes_are_removed_by_the_next_run(run_folder: Path) -> None:
    writer = _start_stuck_writer(run_folder)
    try:
        [partial] = run_folder.glob(".partial-nbscale_checkpoint_epoch0005-*.pt")
        _age(partial, 10 * STALE_PARTIAL_S)  # old, but its writer lives: another run may be writing it
        nbscale.train(tiny_net(), TRAIN, quiet(checkpoint_path=str(run_folder)))
        assert partial.exists()
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    earlier = run_folder / ".partial-abc123_x.pt"  # the earlier version's mkstemp name
    earlier.write_bytes(b"half")
    fresh = run_folder / ".partial-nbscale_checkpoint_epoch0007-new.pt"  # just created: its writer may not lock yet
    fresh.write_bytes(b"")
    foreign = run_folder / ".partial-notes.pt"  # not a name nbscale gives
    foreign.write_bytes(b"keep me")
    for path in (partial, earlier, foreign):
        _age(path, 10 * STALE_PARTIAL_S)

    nbscale.train(tiny_net(), TRAIN, quiet(checkpoint_path=str(run_folder)))
    assert _partials(run_folder) == sorted([fresh.name, foreign.name])
    assert sorted(p.name for p in run_folder.glob("nbscale_*.pt")) == [
        "nbscale_checkpoint_epoch0001.pt",
        "nbscale_checkpoint_epoch0002.pt",
    ]


def test_a_checkpoint_refers_to_nothing_but_tensors_plain_values_and_history_entries(run_folder: Path) -> None:
    import pickletools

    opcodes = pickletools.genops(_data_pickle(checkpoint_file(run_folder, 2)))
    names = {argument for opcode, argument, _ in opcodes if opcode.name == "GLOBAL"}
    assert "nbscale.training.events IterationDone" in names
    assert names <= {
        "torch._utils _rebuild_tensor_v2",
        "collections OrderedDict",
        "torch FloatStorage",
        "torch ByteStorage",
        "torch LongStorage",
        "nbscale.training.events IterationDone",
    }, names


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"epoch": "2"}, "its 'epoch' is a str"),
        ({"epoch": True}, "its 'epoch' is a bool"),
        ({"model": [1, 2]}, "its 'model' is a list"),
        ({"model": {"weight": 1.0}}, "its 'model' is not a state_dict of tensors"),
        ({"history": ["iteration 1"]}, "its 'history' holds entries other than nbscale's"),
        ({"rng": torch.zeros(3)}, "its 'rng' is not a random-number generator state"),
        ({"optimizer": {}}, "its 'optimizer' is not an optimizer's state_dict"),
        ({"options": ["sgdm"]}, "its 'options' is a list"),
        ({"best": None}, "its 'best' is a NoneType"),
        ({"seed": None, "samples": None}, "its 'seed' is a NoneType"),
    ],
)
def test_a_checkpoint_of_the_right_types_but_the_wrong_shape_is_refused(
    run_folder: Path, tmp_path: Path, change: dict, words: str
) -> None:
    state = torch.load(checkpoint_file(run_folder, 2), weights_only=False)  # our own file: trusted here
    bent = tmp_path / "bent.pt"
    torch.save({**state, **change}, bent)
    with pytest.raises(OptionsError) as caught:
        nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=bent)
    assert f"resume_from='{bent}' is not an nbscale training checkpoint ({words})" in str(caught.value)
    del state["seed"]
    torch.save(state, bent)
    with pytest.raises(OptionsError, match=r"not an nbscale training checkpoint \(it has no 'seed'\)"):
        nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=bent)


@pytest.fixture
def room_for_one_checkpoint(run_folder: Path, tmp_path: Path):
    """A folder (a small tmpfs) with room for one checkpoint of the 2-epoch run but not for a second."""
    size = (run_folder / "nbscale_checkpoint_epoch0001.pt").stat().st_size
    folder = tmp_path / "small"
    folder.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2},mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): run as root to test a full disk")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _full_folder_error_says_what_and_how(message: str, folder: Path) -> None:
    assert f"checkpoint_path={str(folder)!r}: the checkpoint of epoch 2 could not be written" in message
    assert "No space left on device" in message and "give another checkpoint_path" in message
    assert "serialization.py" not in message and "inline_container" not in message  # no torch internals


def test_a_checkpoint_folder_that_fills_up_is_one_clear_error_and_the_last_checkpoint_resumes(
    room_for_one_checkpoint: Path,
) -> None:
    folder = room_for_one_checkpoint
    with pytest.raises(OptionsError) as failed:
        nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3, checkpoint_path=str(folder)))
    _full_folder_error_says_what_and_how(str(failed.value), folder)
    assert sorted(os.listdir(folder)) == ["nbscale_checkpoint_epoch0001.pt"]  # and no partial file
    _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2), resume_from=folder)
    assert info.stop_reason == "Max epochs completed" and info.epoch[-1] == 2


@pytest.mark.slow
def test_a_checkpoint_folder_that_fills_up_during_a_pool_training_is_one_clear_error_and_the_pool_works(
    room_for_one_checkpoint: Path,
) -> None:
    folder = room_for_one_checkpoint
    with nbscale.Pool(2, cpu=True) as pool:
        with pytest.raises(nbscale.WorkerError) as failed:
            nbscale.train(
                tiny_net(), TRAIN, quiet(max_epochs=3, checkpoint_path=str(folder), execution_environment="parallel")
            )
        message = str(failed.value)
        _full_folder_error_says_what_and_how(message, folder)
        assert "Traceback" not in message
        assert f"resume_from={str(folder)!r}" in message  # the recovery hint names the intact checkpoint
        assert sorted(os.listdir(folder)) == ["nbscale_checkpoint_epoch0001.pt"]
        _, info = nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=2, execution_environment="parallel"))
        assert info.stop_reason == "Max epochs completed" and len(set(pool.run(os.getpid))) == 2


@pytest.mark.parametrize("kept", [0.5, 0.0])
def test_a_checkpoint_cut_short_is_named_as_such_with_the_checkpoints_beside_it(run_folder: Path, kept: float) -> None:
    newest = run_folder / "nbscale_checkpoint_epoch0002.pt"
    whole = newest.read_bytes()
    newest.write_bytes(whole[: int(len(whole) * kept)])  # as a copy that did not finish leaves it
    for resume_from in (newest, run_folder):
        with pytest.raises(OptionsError) as refused:
            nbscale.train(tiny_net(), TRAIN, quiet(max_epochs=3), resume_from=resume_from)
        message = str(refused.value)
        read = "" if resume_from == newest else f": its newest checkpoint, {newest.name},"
        assert (
            f"resume_from={str(resume_from)!r}{read} is cut short or damaged ({int(len(whole) * kept)} bytes" in message
        )
        assert "nbscale_checkpoint_epoch0001.pt" in message and "Invalid argument" not in message
    _, info = nbscale.train(
        tiny_net(), TRAIN, quiet(max_epochs=2), resume_from=run_folder / "nbscale_checkpoint_epoch0001.pt"
    )
    assert info.epoch[-1] == 2
