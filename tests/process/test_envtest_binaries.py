"""The control-plane binaries are decompressed once into `.envtest/bin`, also when
several test workers start a control plane at the same moment on a fresh clone."""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
from pathlib import Path

from devplug.testing.controlplane import decompress

NAMES = ("kube-apiserver", "kube-scheduler")


def packed_release(folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    contents = {}
    for name in NAMES:
        # Several MiB each, so that the workers' copies overlap in time.
        contents[name] = (name.encode() + os.urandom(64)) * 60_000
        (folder / f"{name}.xz").write_bytes(lzma.compress(contents[name], preset=0))
    return contents


def test_workers_that_decompress_at_once_all_find_whole_binaries(tmp_path: Path) -> None:
    contents = packed_release(tmp_path / "k8s")
    bin_dir = tmp_path / "bin"
    script = (
        "import sys; from pathlib import Path; "
        "from devplug.testing.controlplane import decompress; "
        "decompress(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "k8s"), str(bin_dir)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, errors
    for name in NAMES:
        target = bin_dir / name
        assert target.read_bytes() == contents[name]
        assert os.access(target, os.X_OK)
    assert sorted(p.name for p in bin_dir.iterdir()) == [".decompress.lock", *NAMES]


def test_an_up_to_date_copy_is_left_as_it_is(tmp_path: Path) -> None:
    packed_release(tmp_path / "k8s")
    bin_dir = tmp_path / "bin"
    decompress(tmp_path / "k8s", bin_dir)
    before = {name: (bin_dir / name).stat().st_ino for name in NAMES}
    decompress(tmp_path / "k8s", bin_dir)
    assert {name: (bin_dir / name).stat().st_ino for name in NAMES} == before
