"""nbscale.gpus(), select_gpu() and %gpu: the no-GPU path always, real NVML where a GPU is visible.

Machines without a GPU also check the table and the CUDA_VISIBLE_DEVICES mapping against a small stand-in for
pynvml that answers the way NVML does on a two-GPU machine.
"""

from __future__ import annotations

import sys

import pytest

import nbscale
from nbscale import gpu as gpu_module
from nbscale.errors import NbscaleError
from tests.nvml_probe import fake_pynvml, nvml_works

needs_no_driver = pytest.mark.skipif(nvml_works(), reason="this machine has an NVIDIA driver")


@needs_no_driver
def test_gpus_without_driver_is_empty_and_says_so_in_one_line():
    found = nbscale.gpus()
    assert len(found) == 0
    assert found.message == "No GPU: the NVIDIA driver was not found on this machine."
    assert repr(found) == found.message
    assert "No GPU" in found._repr_html_() and "\n" not in repr(found)
    assert found.to_dict() == {"gpus": [], "message": found.message}


@needs_no_driver
def test_select_gpu_without_gpu_is_an_nbscale_error_naming_the_index():
    with pytest.raises(NbscaleError, match=r"GPU 1 does not exist: this process sees no GPU"):
        nbscale.select_gpu(1)


@pytest.mark.parametrize("index", ["1", 1.0, True, None])
def test_select_gpu_of_something_not_an_index_says_it_takes_a_whole_number(index):
    with pytest.raises(NbscaleError, match=r"select_gpu\(\) takes a GPU's index, a whole number as %gpu shows it"):
        nbscale.select_gpu(index)


def test_gpus_without_pynvml_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    assert nbscale.gpus().message == gpu_module.NO_NVML


# --- a stand-in for pynvml on a machine with two GPUs (tests/fake_nvml) -------------------------------------------


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))  # no other test's or notebook's reservations
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_module._selection, "index", None)


def test_gpus_reads_every_field_and_tolerates_unsupported_ones(two_gpus):
    first, second = nbscale.gpus()
    assert (first.index, first.name, first.compute_capability) == (0, "NVIDIA H100 80GB HBM3", "9.0")
    assert (first.memory_used_mb, first.memory_total_mb) == (10 * 1024, 80 * 1024)
    assert (first.utilization_percent, first.temperature_c, first.power_w) == (63, 41, 312.5)
    assert first.processes == (gpu_module.GpuProcess(4242, "python", 2048.0),)  # compute+graphics listed once
    assert second.power_w is None and second.processes == ()


def test_gpu_table_shows_each_gpu_in_text_and_html(two_gpus):
    found = nbscale.gpus()
    text = repr(found).splitlines()
    assert text[0].split() == list(gpu_module_columns())
    assert "NVIDIA H100 80GB HBM3" in text[1] and "63%" in text[1] and "10,240 / 81,920 MiB" in text[1]
    assert "python 4242" in text[1] and text[2].rstrip().endswith("none")
    page = found._repr_html_()
    assert page.count("<tr>") == 3 and "NVIDIA A100-SXM4-40GB" in page and "width:63%" in page


def gpu_module_columns() -> tuple[str, ...]:
    from nbscale.ui.gpu_table import COLUMNS

    return COLUMNS


@pytest.mark.parametrize(
    ("visible", "physical"),
    [("1", [1]), ("1,0", [1, 0]), ("GPU-aaaa1", [1]), ("0,7,1", [0]), ("", []), ("-1", [])],
)
def test_indices_follow_cuda_visible_devices(two_gpus, monkeypatch, visible, physical):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = nbscale.gpus()
    assert [(g.index, g.nvml_index) for g in found] == list(enumerate(physical))
    if not physical:
        assert "CUDA_VISIBLE_DEVICES" in found.message


def test_select_gpu_of_a_missing_index_names_the_gpus_that_exist(two_gpus):
    with pytest.raises(gpu_module.GpuError, match=r"GPU 2 does not exist: .*0 \(NVIDIA H100.*1 \(NVIDIA A100"):
        nbscale.select_gpu(2)


def test_select_gpu_records_the_choice_where_torch_has_no_cuda(two_gpus):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch can use CUDA here; the gpu-marked test covers it")
    with pytest.warns(UserWarning, match="cannot use CUDA"):
        chosen = nbscale.select_gpu(1)
    assert chosen.index == 1 and chosen.selected
    assert [g.selected for g in nbscale.gpus()] == [False, True]
    assert "* the notebook's GPU" in repr(nbscale.gpus())


# --- real kernel, real NVML -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gpu_magic_shows_the_table_or_the_no_gpu_line_and_rejects_a_missing_index(kernel):
    shown = kernel.run("%gpu\nafterwards = 1")  # shown wherever the line stands in its cell
    assert shown.ok, shown.text
    if nvml_works():
        assert "compute" in shown.text and "memory" in shown.text
    else:
        assert "No GPU: the NVIDIA driver was not found on this machine." in shown.text
    wrong = kernel.run("%gpu 99")
    assert wrong.error_name == "GpuError" and "GPU 99 does not exist" in wrong.text


def test_gpu_magic_has_magic_arguments_help():
    from nbscale.magics.gpu import GpuMagics

    assert "%gpu [index]" in GpuMagics.gpu.__doc__ and "select the notebook" in GpuMagics.gpu.__doc__


@pytest.mark.gpu
def test_gpus_lists_real_gpus_from_nvml():
    found = nbscale.gpus()
    assert len(found) >= 1 and found.message is None
    first = found[0]
    assert first.index == 0 and first.name and first.compute_capability
    assert first.memory_total_mb and first.memory_total_mb > 1000
    assert 0 <= (first.utilization_percent or 0) <= 100
    assert first.name in repr(found) and first.name in found._repr_html_()


@pytest.mark.gpu
def test_select_gpu_sets_torchs_current_device():
    import torch

    last = len(nbscale.gpus()) - 1
    chosen = nbscale.select_gpu(last)
    assert chosen.selected and torch.cuda.current_device() == last
    with pytest.raises(gpu_module.GpuError, match=f"GPU {last + 1} does not exist"):
        nbscale.select_gpu(last + 1)
    nbscale.select_gpu(0)


@pytest.mark.slow
def test_gpus_example_notebook_runs_anywhere():
    from pathlib import Path

    from tests.kernel_session import run_notebook

    notebook = run_notebook(Path(__file__).resolve().parent.parent / "examples" / "gpus.ipynb", timeout=120)
    printed = "\n".join(
        str(output.get("text") or output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        for output in cell.get("outputs", [])
    )
    assert ("No GPU" in printed) != bool(nbscale.gpus())
