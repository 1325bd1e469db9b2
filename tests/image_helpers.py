"""The image `make image` builds: its archive and its name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT / "build" / "devplug-image.tar"


def project_version() -> str:
    found = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found is not None
    return found.group(1)


def image_name() -> str:
    # The DaemonSet's `localhost/devplug:VERSION`: a name no registry resolves.
    return f"localhost/devplug:{project_version()}"


def build_image() -> Path:
    """`make image` (nothing to do when the archive is up to date); the archive."""
    build = subprocess.run(["make", "-s", "image"], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    return ARCHIVE
