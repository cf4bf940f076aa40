"""`%load_ext nbscale` and `%unload_ext nbscale` in a real kernel: magics, error display, other handlers."""

from __future__ import annotations

import re

import pytest

from tests.kernel_session import KernelSession

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    return ANSI.sub("", text)


@pytest.fixture
def bare_kernel():
    session = KernelSession()
    yield session
    session.shutdown()


def test_unload_ext_removes_the_magics_and_restores_the_previous_error_handler(bare_kernel: KernelSession) -> None:
    setup = bare_kernel.run(
        "class Mine(Exception): pass\n"
        "def mine(shell, etype, value, tb, tb_offset=None):\n"
        "    print('MINE HANDLED', value)\n"
        "    return []\n"
        "get_ipython().set_custom_exc((Mine,), mine)\n"
        "%load_ext nbscale"
    )
    assert setup.ok, setup.stderr
    # the earlier extension's handler still sees its exceptions while nbscale is loaded
    other = bare_kernel.run("raise Mine('boom')")
    assert "MINE HANDLED boom" in other.text
    short = bare_kernel.run("import nbscale\nnbscale.TrainingOptions(max_epochs=0)")
    assert "OptionsError: TrainingOptions.max_epochs=0 is not allowed" in plain(short.text)
    assert "Traceback" not in short.text
    unloaded = bare_kernel.run("%unload_ext nbscale\nprint('pool' in get_ipython().magics_manager.magics['line'])")
    assert unloaded.stdout.strip().endswith("False"), unloaded.text
    again = bare_kernel.run("raise Mine('after')")
    assert "MINE HANDLED after" in again.text
    full = bare_kernel.run("nbscale.TrainingOptions(max_epochs=0)")
    assert "Traceback" in full.text
    reloaded = bare_kernel.run("%load_ext nbscale\nprint('pool' in get_ipython().magics_manager.magics['line'])")
    assert reloaded.stdout.strip().endswith("True"), reloaded.stdout + reloaded.stderr


def test_xmode_verbose_shows_the_traceback_of_nbscale_errors(bare_kernel: KernelSession) -> None:
    bare_kernel.run("%load_ext nbscale\nimport nbscale")
    verbose = bare_kernel.run("%xmode Verbose\nnbscale.TrainingOptions(max_epochs=0)")
    shown = verbose.text
    assert "OptionsError" in shown and "check_field" in shown, shown
