"""Shared fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.testing.controlplane import ControlPlane, how_to_provide

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp folder with a short path: unix socket paths must fit in 107 bytes, and
    pytest's tmp_path plus a socket name can exceed that."""
    folder = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    """One throwaway control plane (etcd, kube-apiserver, kube-scheduler) per test run,
    shared by every test that talks to an API server; skipped, saying how to provide
    the binaries, where they are absent."""
    plane = ControlPlane.find(ROOT)
    if plane is None:
        pytest.skip(how_to_provide(ROOT))
    try:
        yield plane.start()
    finally:
        plane.stop()
