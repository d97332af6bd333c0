"""The Makefile installs what each command needs: `make run` the package alone, `make
test` and `make lint` the dev extras too; each install runs once until pyproject.toml
changes. Read from ``make -n`` (what make would run) against a virtualenv path of the
test's own, so nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "pip install --quiet -e .\n"
DEV = "pip install --quiet -e '.[dev]'"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _would_run(target: str, venv: Path, *extra: str) -> str:
    # Not as a sub-make of `make test`: its flags would reach this make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}", *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_run_on_a_fresh_machine_installs_the_package_without_dev_extras(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run = _would_run("run", venv)
    assert PACKAGE in run and "[dev]" not in run
    assert run.rstrip().endswith(f"{venv}/bin/opsloop local")
    for target in ("test", "lint"):
        assert DEV in _would_run(target, venv)


def test_each_install_runs_once_until_pyproject_changes(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # `make run` was run
    assert "pip" not in _would_run("run", venv)
    assert DEV in _would_run("test", venv)  # the dev extras are still missing
    (venv / ".installed-dev").touch()  # `make test` was run
    for target in ("run", "test", "lint"):
        assert "pip" not in _would_run(target, venv)
    # A changed pyproject.toml (-W: as if it were just edited) installs again.
    assert PACKAGE in _would_run("run", venv, "-W", "pyproject.toml")
    assert DEV in _would_run("test", venv, "-W", "pyproject.toml")


def test_the_dev_install_renews_the_package_stamp_too(tmp_path: Path) -> None:
    """After `make test` on a fresh machine, `make run` installs nothing more."""
    recipe = _would_run("test", tmp_path / "venv")
    touch = next(line for line in recipe.splitlines() if line.startswith("touch "))
    assert set(touch.split()[1:]) == {
        f"{tmp_path}/venv/.installed",
        f"{tmp_path}/venv/.installed-dev",
    }
