"""Shared fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp folder with a short path: unix socket paths must fit in 107 bytes, and
    pytest's tmp_path plus a socket name can exceed that."""
    folder = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
