"""Installing nbscale as a user does: a wheel built from this checkout, into a fresh venv, then the Quick start;
and a plain checkout (no built extension) with no Node at all.

The wheel carries the prebuilt JupyterLab extension; with that build present (as in the sdist), building the
wheel needs no Node (the build hook's skip-if-exists): the build runs here with no node or npm on PATH.

The fresh venv shares the checkout's pinned torch, torchvision and triton and their CUDA wheels (about 5 GB, which
CI's disk could not hold twice: "No space left on device") through a .pth file; pip sees them installed at the
pinned versions and installs everything else fresh, torch's own Python dependencies included.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT, KernelSession
from tests.labextension.jupyter_server import end_server
from tests.test_readme import quick_start_code

pytestmark = pytest.mark.slow

BUILT_EXTENSION = REPO_ROOT / "nbscale" / "labextension" / "package.json"
# what the torch stack's wheels put in site-packages (next to their .dist-info folders)
TORCH_STACK_FOLDERS = {"torch", "functorch", "torchgen", "torchvision", "torchvision.libs", "triton", "nvidia", "cuda"}


def _constraints(folder: Path) -> list[str]:
    """This interpreter's installed versions as pins (the lock `make venv` installed, or the floors in
    `make test-oldest`'s venv), so the fresh venv resolves to what the shared torch stack was installed with."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # the first of a name is the one Python imports
        name = (dist.metadata["Name"] or "").lower()
        if name and name != "nbscale":
            pins.setdefault(name, dist.version)
    path = folder / "installed-constraints.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    return ["-c", str(path)]


def _share_the_torch_stack(venv: Path, shelf: Path) -> None:
    """Put links to this interpreter's torch-stack folders in `shelf` and `shelf` on `venv`'s path (a .pth file)."""
    shelf.mkdir()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"].lower()
        tops = {Path(file).parts[0] for file in dist.files or []} - {".."}
        folders = {top for top in tops if not top.endswith(".dist-info")}
        if name.startswith(("torch", "triton", "nvidia-", "cuda-")) and folders <= TORCH_STACK_FOLDERS:
            for top in tops - {entry.name for entry in shelf.iterdir()}:
                (shelf / top).symlink_to(Path(str(dist.locate_file(top))))
    site_packages = next(venv.glob("lib/python*/site-packages"))
    (site_packages / "shared_torch_stack.pth").write_text(f"{shelf}\n")


def _plain_checkout(destination: Path) -> Path:
    """The files git would give a clone of this checkout (no built extension, no node_modules, no venv)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def test_a_plain_checkout_installs_without_node_and_says_how_to_get_the_extension(tmp_path: Path) -> None:
    checkout = _plain_checkout(tmp_path / "checkout")
    assert not (checkout / "nbscale" / "labextension").exists()
    no_node = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python and pip only: no node, no npm
    no_node.pop("PYTHONPATH", None)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "dist"), str(checkout)],
        env=no_node,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "nbscale: the JupyterLab extension (status bar and panel) was left out of this install: no npm" in (
        built.stdout + built.stderr
    )
    wheel = next((tmp_path / "dist").glob("nbscale-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert not [name for name in names if "labextension" in name], names
    assert any(name.endswith("etc/jupyter/jupyter_server_config.d/nbscale.json") for name in names)

    # a fresh venv that reads this one's packages (a .pth file): the wheel is the only nbscale, and JupyterLab's
    # paths are the fresh venv's
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    (site_packages / "this_venv.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    # --prefix, as pip installs into a venv: the server extension's config lands in the venv's etc/jupyter;
    # --ignore-installed: this pip runs in the test's venv, where nbscale is installed too (editable), and would
    # uninstall it there first (every later kernel then failed to import nbscale)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--prefix", str(venv)]
    pip.append(str(wheel))
    subprocess.run(pip, env=no_node, check=True, timeout=300)
    assert (venv / "etc" / "jupyter" / "jupyter_server_config.d" / "nbscale.json").is_file()
    python = str(venv / "bin" / "python")
    data = tmp_path / "jupyter-data"
    where = {
        **no_node,
        "JUPYTER_PATH": str(data),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
    }
    found = subprocess.run(
        [python, "-c", "import nbscale; print(nbscale.__file__)"],
        env=where,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.stdout.startswith(str(site_packages)), found.stdout + found.stderr
    doctor = subprocess.run(
        [python, "-m", "nbscale", "doctor"],
        env=where,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "The JupyterLab extension (status bar and panel) is not installed" in doctor.stdout, doctor.stdout
    # the Jupyter server of that install says the same in its terminal, as a warning of its log
    log = _jupyter_server_log(python, where, tmp_path)
    assert "nbscale: server extension loaded" in log, log
    assert re.findall(r"^\[W [^]]* ServerApp\] (nbscale: .*)$", log, re.MULTILINE) == [NOT_INSTALLED_LOG_LINE], log


# the line a Jupyter server of a Node-less install prints in its terminal, after "[W <time> ServerApp] "
NOT_INSTALLED_LOG_LINE = (
    "nbscale: the JupyterLab extension (status bar and panel) is not installed: this nbscale was installed "
    "without Node. Install Node.js 20+ and reinstall, or install a wheel made by `make wheel` (docs/install.md)."
)


def _jupyter_server_log(python: str, env: dict[str, str], tmp_path: Path) -> str:
    """What a Jupyter server started with `python` logs until it serves (its runtime file is written), stopped
    then; the server extensions it loads are the ones the install's etc/jupyter enables."""
    log_path = tmp_path / "server.log"
    root = ["--allow-root"] if os.geteuid() == 0 else []
    command = [python, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", "--port=0", *root]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log)
        try:
            serving = Path(env["JUPYTER_RUNTIME_DIR"]) / f"jpserver-{server.pid}.json"
            deadline = time.monotonic() + 120
            while not serving.is_file() and server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)  # polled with a deadline: the server writes the file once it listens
            assert serving.is_file(), f"the Jupyter server did not start:\n{log_path.read_text()[-3000:]}"
        finally:
            end_server(server, wait_s=30)  # the log is written by then
    return log_path.read_text()


@pytest.mark.timeout(1200)  # a build, a fresh venv's install and two trainings: >300 s on 2 busy cores
def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quick_start(tmp_path: Path) -> None:
    if not BUILT_EXTENSION.is_file():
        pytest.skip("the lab extension is not built in this checkout: `make venv` builds it")
    no_node = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python and pip only: no node, no npm
    no_node.pop("PYTHONPATH", None)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO_ROOT)],
        env=no_node,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(dist.glob("nbscale-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith("share/jupyter/labextensions/nbscale/package.json") for name in names), names[-20:]
    assert any(name.endswith("etc/jupyter/jupyter_server_config.d/nbscale.json") for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _share_the_torch_stack(venv, tmp_path / "torch-stack")
    python = str(venv / "bin" / "python")
    # --no-compile: byte-compiling ~120 packages is CPU the suite needs elsewhere; Python compiles what it imports
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-compile", *_constraints(tmp_path), f"{wheel}[examples]"],
        env=no_node,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert (venv / "share" / "jupyter" / "labextensions" / "nbscale" / "package.json").is_file()
    assert not list(venv.glob("lib/python*/site-packages/torch")), "pip installed torch again, not the shared one"

    # a kernel of the fresh venv, away from this checkout (so `import nbscale` finds the installed wheel)
    home = tmp_path / "work"
    home.mkdir()
    session = KernelSession(cwd=home, env={"PYTHONPATH": ""}, python=python)
    try:
        where = session.run("import nbscale; print(nbscale.__file__)")
        assert str(venv) in where.stdout, where.text
        result = session.run(quick_start_code(), timeout=300)
        assert result.ok, result.text
        assert len(re.findall(r"validation accuracy (\d\.\d+)", result.stdout)) == 2, result.stdout
    finally:
        session.close()
        shutil.rmtree(venv, ignore_errors=True)  # ~1 GB a later test's disk needs more
