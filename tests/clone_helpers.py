"""Tests run from a bare copy of the repository (no binaries beside it nor named), to
check that what needs them skips with a how-to instead of failing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from devplug.testing.controlplane import ENV_DIR

ROOT = Path(__file__).resolve().parent.parent


def pytest_in_bare_clone(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    """pytest -rs on `targets` of a copy of tests/ in `tmp_path`, with $DEVPLUG_K8S_DIR
    naming a folder that does not exist."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "tests", clone / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", clone)
    env = {**os.environ, ENV_DIR: str(tmp_path / "nowhere")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *targets],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
