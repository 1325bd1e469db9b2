"""devplug's imports point down its floors and close no cycle (docs/architecture.md): the
contracts in pyproject.toml, checked by import-linter over the package as it is, and
shown to catch each kind of breach on a copy of the package with one import added."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import devplug

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
PACKAGE = Path(devplug.__file__).parent
LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def lint(python_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, over devplug as installed or over the
    copy in `python_path`."""
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
    result = subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(PYPROJECT), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=python_path or ROOT,
        timeout=120,
        check=False,
    )
    result.stdout = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # some versions colour it
    return result


def test_every_import_points_down_the_floors_and_closes_no_cycle() -> None:
    result = lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the devplug package, importable from `tmp_path` ahead of the real one."""
    shutil.copytree(PACKAGE, tmp_path / "devplug", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def add_import(copy: Path, module: str, statement: str) -> None:
    path = copy / "devplug" / module
    path.write_text(path.read_text() + f"\n{statement}\n")


def broken(copy: Path) -> str:
    result = lint(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout


def test_an_import_up_a_floor_breaks_the_floors(copy: Path) -> None:
    add_import(copy, "ground/tables.py", "import devplug.cli.style")
    out = broken(copy)
    assert "Imports point down the floors BROKEN" in out
    assert "devplug.ground.tables -> devplug.cli.style" in out


def test_an_import_between_two_packages_of_one_floor_breaks_the_floors(copy: Path) -> None:
    add_import(copy, "kube/names.py", "import devplug.fakes.gpumodels")
    out = broken(copy)
    assert "Imports point down the floors BROKEN" in out
    assert "devplug.kube.names -> devplug.fakes.gpumodels" in out


def test_product_code_importing_the_test_kit_breaks_its_contract(copy: Path) -> None:
    add_import(copy, "plan/variants.py", "import devplug.testing.harness")
    out = broken(copy)
    assert "Product code does not stand on the test kit BROKEN" in out
    assert "devplug.plan.variants -> devplug.testing.harness" in out


def test_a_package_given_no_floor_breaks_the_floors(copy: Path) -> None:
    (copy / "devplug" / "newfloor").mkdir()
    (copy / "devplug" / "newfloor" / "__init__.py").write_text('"""New."""\n')
    out = broken(copy)
    assert "Imports point down the floors BROKEN" in out
    assert "devplug.newfloor" in out


def test_two_modules_importing_each_other_break_the_acyclic_contract(copy: Path) -> None:
    add_import(copy, "kube/names.py", "import devplug.kube.quantity")
    add_import(copy, "kube/quantity.py", "import devplug.kube.names")
    out = broken(copy)
    assert "Imports point down the floors KEPT" in out
    assert "No cycles are allowed in devplug.kube." in out


def test_a_cycle_through_subpackages_breaks_the_acyclic_contract(copy: Path) -> None:
    add_import(copy, "framework/dra/layout.py", "import devplug.framework.plugin")
    add_import(copy, "framework/plugin.py", "import devplug.framework.dra.rules")
    out = broken(copy)
    assert "No cycles are allowed in devplug.framework." in out
