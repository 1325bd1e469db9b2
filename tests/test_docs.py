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
