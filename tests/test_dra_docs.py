"""The examples of docs/dra.md are valid as written (the Kubernetes objects are checked
against a real API server in test_dra_cluster.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from devplug.sources import build_plugins, parse_config

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "dra.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def manifests() -> list[dict[str, Any]]:
    """The Kubernetes objects of the doc's YAML blocks (quantities as the Python client
    takes them, strings; kubectl takes `1` as well)."""
    docs = [d for b in blocks("yaml") for d in yaml.safe_load_all(b) if d]
    objects = [d for d in docs if "apiVersion" in d]
    for obj in objects:
        for container in (obj.get("spec") or {}).get("containers") or []:
            for section in (container.get("resources") or {}).values():
                if isinstance(section, dict):
                    section.update({k: str(v) for k, v in section.items() if isinstance(v, int)})
    return objects


def config_examples() -> list[str]:
    return [b for b in blocks("yaml") if b.lstrip().startswith("resources:")]


def test_config_examples_are_valid() -> None:
    first, migration = config_examples()
    [plugin] = build_plugins(parse_config(first, "docs/dra.md"))
    assert (plugin.resource_name, plugin.spec.mode) == ("devplug.io/fpga", "dra")
    [counted] = parse_config(migration, "docs/dra.md").resources
    assert (counted.mode, counted.node_mode_label) == ("devicePlugin", "devplug.io/fpga-mode")


def test_driver_example_defines_a_driver(tmp_path: Path) -> None:
    [code] = blocks("python")
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/dra.md", "exec"), namespace)
    widgets = namespace["Widgets"]()
    assert widgets.driver_name == "widget.example.com"


def test_every_feature_has_its_class_claim_and_pod() -> None:
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests()]
    assert kinds == [
        ("DeviceClass", "fpga.devplug.io"),
        ("ResourceClaim", "one-u280"),
        ("Pod", "synth"),
        ("Pod", "counted-fpga"),
        ("DeviceClass", "gpu-40gib.devplug.io"),
        ("ResourceClaimTemplate", "gpu-40gib"),
        ("Pod", "train"),
        ("ResourceClaim", "diagnose-fpga"),
        ("Pod", "diagnose"),
    ]


def test_the_class_of_the_page_is_the_one_check_prints() -> None:
    """The DeviceClass shown is what `devplug check --device-classes` makes of the
    page's config, not a hand-written one."""
    from devplug.framework.dra.classes import device_class

    [shown] = [m for m in manifests() if m["metadata"]["name"] == "fpga.devplug.io"]
    assert shown == device_class("fpga.devplug.io", "devplug.io/fpga")


def test_readme_dra_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    [block] = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "driver: fpga.example.com" in b
    ]
    config = parse_config(block, "README.md")
    assert [(r.mode, r.dra and r.dra.driver) for r in config.resources] == [
        ("dra", "fpga.example.com")
    ]
