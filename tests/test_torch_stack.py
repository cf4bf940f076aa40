"""`nbscale doctor` names the torch stack (torch and its CUDA, torchvision, the image decoder in use), and a
torchcodec that is installed but does not load is said, by doctor and by one warning at the first decode, not
passed over in silence. The broken torchcodec is a package on PYTHONPATH whose library fails as a torchcodec built
for another torch does (an OSError naming an undefined symbol)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision

from tests.kernel_session import REPO_ROOT
from tests.test_cli import nbscale

FAILURE = "libtorchcodec_core8.so: undefined symbol: _ZN3c1013MessageLogger6streamB5cxx11Ev"


def _broken_torchcodec(folder: Path) -> Path:
    package = folder / "torchcodec"
    (package / "decoders").mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise OSError({FAILURE!r})\n")
    (package / "decoders" / "__init__.py").write_text("")
    return folder


@pytest.mark.slow
def test_doctor_names_torch_its_cuda_torchvision_and_the_decoder_in_use() -> None:
    found = nbscale("doctor")
    lines = {line[9:].split("  ")[0]: line for line in found.stdout.splitlines()}
    assert f"torch {torch.__version__}" in lines["torch"], found.stdout
    cuda = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build (no CUDA)"
    assert cuda in lines["torch"]
    assert lines["torchvision"].endswith(f"torchvision {torchvision.__version__}")
    from nbscale.data.reading import decoder_in_use

    decoder, failure = decoder_in_use()
    if failure is None:
        assert lines["image decoder"].startswith("OK") and lines["image decoder"].endswith(decoder)
    else:  # `make test-oldest`: pyproject's torchcodec does not load beside torch 2.5, and doctor says so
        assert lines["image decoder"].startswith("PROBLEM") and failure in lines["image decoder"], found.stdout


@pytest.mark.slow
def test_doctor_says_when_an_installed_torchcodec_fails_to_load(tmp_path: Path) -> None:
    found = nbscale("doctor", extra_path=_broken_torchcodec(tmp_path))
    line = next(line for line in found.stdout.splitlines() if "image decoder" in line)
    assert line.startswith("PROBLEM") and found.returncode == 1, found.stdout
    assert f"failed to load (OSError: {FAILURE}), so images decode with torchvision's deprecated decoders" in line
    assert f"Install the torchcodec release made for torch {torch.__version__.split('+')[0]}" in line


@pytest.mark.slow
def test_the_first_decode_after_a_failed_torchcodec_warns_once_and_decodes_with_torchvision(tmp_path: Path) -> None:
    image = tmp_path / "red.png"
    from PIL import Image

    Image.new("RGB", (4, 3), (255, 0, 0)).save(image)
    code = (
        "import warnings\nwarnings.simplefilter('always')\n"
        "from nbscale.data.reading import read_image\n"
        f"first = read_image({str(image)!r}); second = read_image({str(image)!r})\n"
        "print(tuple(first.shape), int(first[0, 0, 0]), int(first[1, 0, 0]))\n"
    )
    paths = [str(_broken_torchcodec(tmp_path / "site")), str(REPO_ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["(3,", "3,", "4)", "255", "0"]
    assert ran.stderr.count("is installed but failed to load") == 1, ran.stderr
