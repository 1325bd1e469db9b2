"""The examples in the README are valid as written."""

from __future__ import annotations

import re
from pathlib import Path

from devplug.sources import build_plugins, parse_config

ROOT = Path(__file__).resolve().parent.parent


def test_readme_config_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "example.com/kvm" in b]
    assert blocks
    for block in blocks:
        plugins = build_plugins(parse_config(block, "README.md"))
        assert [p.resource_name for p in plugins] == [
            "example.com/kvm",
            "example.com/serial",
            "example.com/fake",
        ]
        kvm = plugins[0].discover()
        assert [d.id for d in kvm] == [f"kvm::{i}" for i in range(10)]
        assert plugins[0].ids_env == "DEVPLUG_EXAMPLE_COM_KVM"


def test_config_reference_examples_are_valid() -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "resources:" in b and "apiVersion" not in b  # not the Pod example
    ]
    assert len(blocks) >= 10
    for block in blocks:
        config = parse_config(block, "docs/config.md")
        # A split by the values found at start serves nothing on a host without them.
        raw_split = any(r.split and r.split.models is None for r in config.resources)
        assert build_plugins(config) or raw_split


def test_readme_hardware_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "split:" in b]
    plugins = build_plugins(parse_config(block, "README.md"))
    assert [p.resource_name for p in plugins] == ["example.com/fpga-u250", "example.com/fpga-u280"]


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (code blocks hold none)."""
    seen: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, anchor = 0, slug
        while anchor in seen:  # a repeated heading gets -1, -2...
            n += 1
            anchor = f"{slug}-{n}"
        seen.add(anchor)
    return seen


def test_relative_links_point_at_files_and_headings_that_exist() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert len(pages) > 5
    assert not broken, "\n".join(broken)
