"""Every module that talks to an API server does it through devplug's own asyncio client
(`devplug.apiserver.client`, chosen by `make bench`: docs/architecture.md). The modules
that still use the official `kubernetes` client are listed below, each with what it
does with it; an entry that no longer uses it fails the test, so the list only shrinks,
and a new user of the official client fails it too."""

from __future__ import annotations

import ast
from pathlib import Path

import devplug

PACKAGE = Path(devplug.__file__).parent
OFFICIAL = ("kubernetes", "devplug.apiserver.official", "devplug.framework.dra.kube")

# Path relative to src/devplug: what it still does through the official client.
NOT_MOVED_YET: dict[str, str] = {
    "apiserver/official.py": "the official client set up from a kubeconfig; goes with the last",
    "framework/dra/kube.py": "the official client of the test kit",
    "testing/controlplane.py": "the test kit's watch until an object matches",
    "testing/nodeapi.py": "the test kit's reads of the real node's objects",
    "testing/realnode.py": "the test kit's client of the real node",
}


def official_users() -> set[str]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        if any(n == m or n.startswith(m + ".") for n in names for m in OFFICIAL):
            found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_no_new_module_uses_the_official_client() -> None:
    new = official_users() - set(NOT_MOVED_YET)
    assert not new, f"use devplug.apiserver.client, not the official client: {sorted(new)}"


def test_a_module_moved_to_the_one_client_leaves_the_list() -> None:
    moved = set(NOT_MOVED_YET) - official_users()
    assert not moved, f"no longer on the official client, remove from NOT_MOVED_YET: {moved}"


def test_the_moved_modules_use_the_one_client() -> None:
    """Node events, the NVIDIA extender agent and the fleet talk through it."""
    for name in ("framework/nodeevents.py", "sources/nvidia/extender.py", "fleet/calls.py"):
        text = (PACKAGE / name).read_text()
        assert "devplug.apiserver.client" in text, name
        assert name not in official_users(), name
