"""Where the control-plane binaries come from, and the skip that says how to provide
them when they are absent (a fresh clone without ../shared/k8s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clone_helpers import pytest_in_bare_clone

from devplug.testing.controlplane import ENV_DIR, ControlPlane, how_to_provide, source_dir

ROOT = Path(__file__).resolve().parents[2]


def fake_release(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("kube-apiserver.xz", "kube-scheduler.xz", "start.sh"):
        (folder / name).write_bytes(b"")
    return folder


def test_nothing_found_where_the_folder_names_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "clone" / "repo"
    root.mkdir(parents=True)
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "nowhere"))
    assert source_dir(root) is None
    assert ControlPlane.find(root) is None
    message = how_to_provide(root)
    assert ENV_DIR in message
    assert str(tmp_path / "clone" / "shared" / "k8s") in message


def test_the_named_folder_wins_over_the_one_beside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    beside = fake_release(tmp_path / "shared" / "k8s")
    monkeypatch.delenv(ENV_DIR, raising=False)
    assert source_dir(root) == beside
    named = fake_release(tmp_path / "elsewhere")
    monkeypatch.setenv(ENV_DIR, str(named))
    assert source_dir(root) == named
    (named / "kube-scheduler.xz").unlink()  # incomplete: the one beside is used
    assert source_dir(root) == beside


def test_cluster_tests_skip_with_the_how_to(tmp_path: Path) -> None:
    """The real-control-plane tests, run from a copy of the repository with no
    binaries beside it nor named: all skipped, with the how-to, none failed."""
    result = pytest_in_bare_clone(tmp_path, "tests/controlplane/dra")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " skipped" in result.stdout
    assert " passed" not in result.stdout
    assert " failed" not in result.stdout
    assert ENV_DIR in result.stdout
    assert "kube-apiserver.xz" in result.stdout
