"""Every module of devplug that talks to an API server does it through devplug's own
asyncio client (`devplug.apiserver.client`, chosen by `make bench`: docs/architecture.md).
The official `kubernetes` client is the test kit's only: tests and benchmarks read
what devplug wrote through a client that shares none of its code. The test kit's
modules that use it are listed below; a product module that uses it fails the test."""

from __future__ import annotations

import ast
from pathlib import Path

import devplug

PACKAGE = Path(devplug.__file__).parent
OFFICIAL = ("kubernetes", "devplug.testing.official")

# Path relative to src/devplug: what it still does through the official client.
TEST_KIT: dict[str, str] = {
    "testing/official.py": "the official client made from a kubeconfig",
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


def test_no_product_module_uses_the_official_client() -> None:
    new = official_users() - set(TEST_KIT)
    assert not new, f"use devplug.apiserver.client, not the official client: {sorted(new)}"
    assert all(name.startswith("testing/") for name in TEST_KIT)


def test_a_test_kit_module_off_the_official_client_leaves_the_list() -> None:
    moved = set(TEST_KIT) - official_users()
    assert not moved, f"no longer on the official client, remove from TEST_KIT: {moved}"


def test_the_moved_modules_use_the_one_client() -> None:
    """Node events, the NVIDIA extender agent and the fleet talk through it."""
    for name in ("framework/nodeevents.py", "sources/nvidia/extender.py", "fleet/calls.py"):
        text = (PACKAGE / name).read_text()
        assert "devplug.apiserver.client" in text, name
        assert name not in official_users(), name
