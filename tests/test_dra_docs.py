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
    """The Kubernetes objects of the doc's YAML blocks."""
    docs = [d for b in blocks("yaml") for d in yaml.safe_load_all(b) if d]
    return [d for d in docs if "apiVersion" in d]


def test_config_examples_are_valid() -> None:
    configs = [parse_config(b, "docs/dra.md") for b in blocks("yaml") if b.startswith("resources:")]
    assert [r.name for c in configs for r in c.resources] == [
        "example.com/fpga",
        "example.com/fpga-region",
        "nvidia.com/gpu",
        "nvidia.com/gpu",
    ]
    [plugin] = build_plugins(configs[0])
    assert plugin.resource_name == "example.com/fpga"


def test_partition_example_publishes_what_the_doc_shows() -> None:
    """The `devplug check` lines of the partition section are those of its config."""
    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources.draconfig import config_driver

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


def test_manifests_ask_for_a_u280_a_40gib_gpu_half_a_card_and_a_gpu_share() -> None:
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests()]
    assert ("ResourceClaim", "one-u280") in kinds
    assert ("ResourceClaimTemplate", "gpu-40gib") in kinds
    assert ("DeviceClass", "gpu-40gib.devplug.io") in kinds
    assert ("ResourceClaimTemplate", "half-fpga") in kinds
    assert ("ResourceClaimTemplate", "gpu-10gib-share") in kinds
    assert ("DeviceClass", "gpu-share.devplug.io") in kinds


def test_readme_dra_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    [block] = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "driver: fpga.example.com" in b
    ]
    config = parse_config(block, "README.md")
    assert [(r.mode, r.dra and r.dra.driver) for r in config.resources] == [
        ("both", "fpga.example.com")
    ]
