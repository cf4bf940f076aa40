"""Workers follow the notebook's folder (as MATLAB's pools do): in a real kernel, with real workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT

pytestmark = pytest.mark.slow


def test_cells_calls_and_tasks_run_in_the_notebooks_folder_after_cd(kernel, tmp_path):
    (tmp_path / "data.txt").write_text("from the notebook's folder")
    assert kernel.run("%pool start 2 --cpu\nimport os, nbscale\npool = nbscale.current_pool()").ok
    assert kernel.run(f"%cd {tmp_path}").ok
    cell = kernel.run("%%spmd\nprint(open('data.txt').read(), os.getcwd())")
    assert cell.ok, cell.text
    for rank in (0, 1):
        assert f"[{rank}] from the notebook's folder {tmp_path}" in cell.stdout
    shown = kernel.run(
        "print(pool.submit(os.getcwd).result(), pool.run(os.getcwd), list(pool.map(os.path.abspath, ['a'])))"
    )
    assert shown.stdout.split(" ", 1) == [str(tmp_path), f"{[str(tmp_path)] * 2} {[str(tmp_path / 'a')]}\n"]
    kernel.run("os.chdir(os.path.dirname(os.getcwd()))")  # os.chdir in the notebook, as %cd
    assert kernel.run("print(pool.submit(os.getcwd).result())").stdout == f"{tmp_path.parent}\n"
    assert "Warning" not in cell.stderr + shown.stderr


def test_a_cell_that_changes_folder_changes_it_for_that_cell_only(kernel, tmp_path):
    kernel.run("%pool start 2 --cpu\nimport os")
    kernel.run(f"%cd {tmp_path}")
    moved = kernel.run("%%spmd\nos.chdir('/')\nprint(os.getcwd())")
    assert "[0] /\n" in moved.stdout and "[1] /\n" in moved.stdout
    after = kernel.run("%%spmd\nprint(os.getcwd())")
    assert f"[0] {tmp_path}\n" in after.stdout and f"[1] {tmp_path}\n" in after.stdout
    assert kernel.run("print(os.getcwd())").stdout == f"{tmp_path}\n"  # the notebook never moved


def test_a_notebook_folder_the_workers_cannot_enter_warns_once_and_runs_where_they_started(kernel, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    kernel.run("%pool start 2 --cpu\nimport os, shutil, nbscale\npool = nbscale.current_pool()")
    kernel.run(f"%cd {gone}")
    kernel.run(f"shutil.rmtree({str(gone)!r})")  # the notebook's current folder is gone, for the workers too
    first = kernel.run("%%spmd\nprint(os.getcwd())")
    assert first.ok, first.text
    assert f"[0] {REPO_ROOT}\n" in first.stdout and f"[1] {REPO_ROOT}\n" in first.stdout  # where the pool started
    assert first.stderr.count("Warning") == 1, first.stderr  # once, not once per rank
    assert f"workers cannot change to the notebook's current folder {str(gone)!r}" in first.stderr
    assert "No such file or directory" in first.stderr and "use absolute paths" in first.stderr
    again = kernel.run("%%spmd\nprint(os.getcwd())\n")
    task = kernel.run("print(pool.submit(os.getcwd).result())")
    assert again.ok and task.stdout == f"{REPO_ROOT}\n"
    assert "Warning" not in again.stderr + task.stderr  # once per pool and folder, not per request
    kernel.run(f"%cd {tmp_path}")
    assert f"[0] {tmp_path}\n" in kernel.run("%%spmd\nprint(os.getcwd())").stdout


def test_training_on_a_pool_writes_relative_checkpoints_in_the_notebooks_folder(kernel, tmp_path: Path):
    kernel.run("%pool start 2 --cpu")
    kernel.run(f"%cd {tmp_path}")
    trained = kernel.run(
        "import torch, nbscale\n"
        "torch.manual_seed(0)\n"
        "x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 2))\n"
        "opts = nbscale.TrainingOptions('sgdm', max_epochs=1, mini_batch_size=16, verbose=False, plots='none',\n"
        "                               execution_environment='parallel', checkpoint_path='checkpoints')\n"
        "net, info = nbscale.train(net, (x, y), opts)\n"
    )
    assert trained.ok, trained.text
    assert list((tmp_path / "checkpoints").iterdir())


def test_a_task_queued_before_a_cd_runs_in_the_folder_it_was_submitted_from(kernel, tmp_path):
    kernel.run("%pool start 2 --cpu\nimport os, time, nbscale\npool = nbscale.current_pool()")
    kernel.run(f"%cd {tmp_path}")
    queued = kernel.run(
        "busy = [pool.submit(time.sleep, 2) for _ in range(2)]\n"
        "later = pool.submit(os.getcwd)\n"
        "os.chdir('/')\n"
        "print(later.running(), later.result(), pool.submit(os.getcwd).result())"
    )
    assert queued.stdout == f"False {tmp_path} /\n", queued.text


def test_modules_in_the_notebooks_folder_are_importable_on_the_workers_after_cd(kernel, tmp_path):
    """As in the kernel (IPython puts '' on its sys.path): a module variable, a function from such a module, and an
    import inside the cell all find the notebook's current folder."""
    (tmp_path / "helper.py").write_text("VALUE = 7\ndef where():\n    return __file__\n")
    (tmp_path / "helper_too.py").write_text("VALUE = 8\n")
    kernel.run("%pool start 2 --cpu\nimport nbscale\npool = nbscale.current_pool()")
    assert kernel.run(f"%cd {tmp_path}").ok
    assert kernel.run("import helper\nfrom helper import where").ok
    cell = kernel.run("%%spmd\nimport helper_too\nprint(helper.VALUE, helper_too.VALUE, where())")
    assert cell.ok, cell.text
    for rank in (0, 1):
        assert f"[{rank}] 7 8 {tmp_path / 'helper.py'}" in cell.stdout
    task = kernel.run("print(pool.submit(where).result(), pool.run(where))")
    assert task.ok and task.stdout == f"{tmp_path / 'helper.py'} {[str(tmp_path / 'helper.py')] * 2}\n", task.text
    kernel.run("%cd /")  # the folder left behind is no longer searched (nor is it in the kernel)
    (tmp_path / "helper_three.py").write_text("VALUE = 9\n")
    gone = kernel.run("%%spmd\nimport helper_three")
    assert not gone.ok and "No module named 'helper_three'" in gone.text
