"""The examples of docs/dra.md are valid as written (the Kubernetes objects are checked
against a real API server in tests/controlplane/dra)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from devplug.sources import build_plugins, parse_config

ROOT = Path(__file__).resolve().parents[2]
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
    configs = [parse_config(b, "docs/dra.md") for b in config_examples()]
    assert [r.name for c in configs for r in c.resources] == [
        "devplug.io/fpga",
        "devplug.io/fpga",
        "example.com/fpga-region",
        "nvidia.com/gpu",
        "nvidia.com/gpu",
    ]
    [plugin] = build_plugins(configs[0])
    assert (plugin.resource_name, plugin.spec.mode) == ("devplug.io/fpga", "dra")
    [counted] = configs[1].resources
    assert (counted.mode, counted.node_mode_label) == ("devicePlugin", "devplug.io/fpga-mode")


def test_partition_example_publishes_what_the_doc_shows() -> None:
    """The `devplug check` lines of the partition section are those of its config."""
    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources.dradriver import config_driver

    [config] = [b for b in blocks("yaml") if b.startswith("resources:") and "region" in b]
    [plugin] = build_plugins(parse_config(config.replace("/dev/xclmgmt0", "/dev/null")))
    plugin.publish(plugin.discover())
    counters, devices = slice_bodies(config_driver(plugin), "node-a", 1)
    shown = DOC.read_text()
    assert f"slice {counters['metadata']['name']} (node node-a): 1 counter set(s)" in shown
    names = [d["name"] for d in devices["spec"]["devices"]]
    assert f"slice {devices['metadata']['name']} (node node-a): {len(names)} device(s)" in shown
    for name in ("fpga0-slot-0", "fpga0-slots-2-3", "fpga0-slots-0-3"):
        assert f"    {name}: model=u250 slots=" in shown
        assert name in names


def test_driver_example_defines_a_driver(tmp_path: Path) -> None:
    [code] = blocks("python")
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/dra.md", "exec"), namespace)
    widgets = namespace["Widgets"]()
    assert widgets.driver_name == "widget.example.com"


def test_every_feature_has_its_class_claim_and_pod() -> None:
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests()]
    for wanted in [
        ("DeviceClass", "fpga.devplug.io"),
        ("ResourceClaim", "one-u280"),
        ("Pod", "synth"),
        ("Pod", "counted-fpga"),
        ("DeviceClass", "gpu-40gib.devplug.io"),
        ("ResourceClaimTemplate", "gpu-40gib"),
        ("Pod", "train"),
        ("ResourceClaim", "diagnose-fpga"),
        ("Pod", "diagnose"),
        ("ResourceClaimTemplate", "half-fpga"),
        ("ResourceClaimTemplate", "gpu-10gib-share"),
        ("DeviceClass", "gpu-share.devplug.io"),
    ]:
        assert wanted in kinds


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
