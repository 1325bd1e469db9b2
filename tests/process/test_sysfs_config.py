"""Bad hardware keys in a config (selectors, pools, policies, CDI, health checks):
`devplug serve` exits 2 with one line naming the file and the field, and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_helpers import devplug

BAD = {
    "bad-hex": ('usb: {vendor: "04g3"}', "resources[0].groups[0].usb.vendor", "hex ID"),
    "unquoted-hex": ("pci: {vendor: 0x10de}", "resources[0].groups[0].pci.vendor", "quote hex"),
    "long-hex": ('pci: {device: "0x12345"}', "resources[0].groups[0].pci.device", "4 digits"),
    "unknown": ('usb: {vendr: "0403"}', "resources[0].groups[0].usb.vendr", "unknown key"),
    "empty": ("usb: {}", "resources[0].groups[0].usb", "no field"),
    "both": ('usb: {vendor: "1"}, pci: {vendor: "1"}', "resources[0].groups[0]", "both"),
    "never": ('pci: {class: "0x0301/0xff00"}', "resources[0].groups[0].pci.class", "never match"),
    "address": ('pci: {address: "3b:00"}', "resources[0].groups[0].pci.address", "PCI address"),
    "glob": (
        'pci: {vendor: "10ee"}, paths: [{path: "/dev/x*"}]',
        "resources[0].groups[0].paths[0].path",
        "no glob",
    ),
    "placeholder": (
        'pci: {vendor: "10ee"}, paths: [{path: "/dev/x{bus}"}]',
        "resources[0].groups[0].paths[0].path",
        "unknown placeholder",
    ),
}
BAD_RESOURCE = {
    "split-never": (
        'pci: {vendor: "10ee", device: ["500c"]}',
        "split: {by: productID, models: {'0x500d': u280}}",
        "resources[0].split.models.0x500d",
        "can never match",
    ),
    "split-class-never": (
        'pci: {class: "0x1200/0xff00"}',
        "split: {by: pciClass, models: {'0x030000': gpu}}",
        "resources[0].split.models.0x030000",
        "can never match: groups[0].pci.class selects only 0x1200/0xff00",
    ),
    "split-vendor-never": (
        'usb: {vendor: "0403"}',
        "split: {by: vendorID, models: {'0x046d': logitech}}",
        "resources[0].split.models.0x046d",
        "can never match: groups[0].usb.vendor selects only 0403",
    ),
    "split-usb-by-pci-class": (
        'usb: {vendor: "0403"}',
        "split: {by: pciClass}",
        "resources[0].split.by",
        "a USB device has no pciClass",
    ),
    "split-bad-hex": (
        'pci: {vendor: "10ee"}',
        "split: {by: productID, models: {'0xzz': a}}",
        "resources[0].split.models.0xzz",
        "hex ID",
    ),
    "split-no-models": (
        'pci: {vendor: "10ee"}',
        "split: {by: productID, models: {}}",
        "resources[0].split.models",
        "at least one",
    ),
    "split-key": (
        'pci: {vendor: "10ee"}',
        "split: {by: colour, models: {a: b}}",
        "resources[0].split.by",
        "expected one of",
    ),
    "policy": (
        'pci: {vendor: "10ee"}',
        "preferred: closest",
        "resources[0].preferred",
        "expected one of",
    ),
    "cdi-mode": (
        'pci: {vendor: "10ee"}',
        "cdi: {mode: names}",
        "resources[0].cdi.mode",
        "expected one of",
    ),
    "cdi-kind": (
        'pci: {vendor: "10ee"}',
        "cdi: {kind: nokind}",
        "resources[0].cdi.kind",
        "vendor/class",
    ),
    "attribute-no-selector": (
        "paths: [{path: /dev/kvm}]",
        "health: {checks: [{attribute: state}]}",
        "resources[0].health.checks[0].attribute",
        "selector",
    ),
    "check-kinds": (
        'pci: {vendor: "10ee"}',
        "health: {checks: [{file: /x, command: [a]}]}",
        "resources[0].health.checks[0]",
        "exactly one",
    ),
    "timeout": (
        'pci: {vendor: "10ee"}',
        "health: {checks: [{command: [a], timeout: 0}]}",
        "resources[0].health.checks[0].timeout",
        "> 0",
    ),
}


def _refused(tmp_path: Path, text: str) -> str:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = devplug("serve", "--config", str(config), "--plugin-dir", str(tmp_path / "plugins"))
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "plugins").exists()  # nothing started
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{config}: ")
    return lines[0]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_selectors_exit_2_naming_the_field(tmp_path: Path, case: str) -> None:
    group, field, problem = BAD[case]
    line = _refused(tmp_path, f"resources: [{{name: example.com/x, groups: [{{{group}}}]}}]")
    assert f": {field}: " in line, line
    assert problem in line, line


@pytest.mark.parametrize("case", sorted(BAD_RESOURCE))
def test_bad_hardware_keys_exit_2_naming_the_field(tmp_path: Path, case: str) -> None:
    group, extra, field, problem = BAD_RESOURCE[case]
    line = _refused(
        tmp_path, f"resources: [{{name: example.com/x, groups: [{{{group}}}], {extra}}}]"
    )
    assert f": {field}: " in line, line
    assert problem in line, line


def test_one_cdi_kind_per_resource(tmp_path: Path) -> None:
    line = _refused(
        tmp_path,
        "resources:\n"
        "  - {name: example.com/a, groups: [{paths: [{path: /dev/a}]}], cdi: {kind: acme.io/x}}\n"
        "  - {name: example.com/b, groups: [{paths: [{path: /dev/b}]}], cdi: {kind: acme.io/x}}\n",
    )
    assert line.endswith(
        "resources[1].cdi.kind: CDI kind 'acme.io/x' is already the kind of resources[0]"
    )


def test_pools_get_valid_cdi_kinds() -> None:
    from devplug.sources import build_plugins, parse_config
    from devplug.sources.hostdev import HostDevicePlugin

    config = parse_config(
        "resources: [{name: example.com/fpga, groups: [{pci: {vendor: '10ee'}}],"
        " cdi: {kind: acme.io/fpga}, split: {by: productID, models: {'500c': u250.v2}}}]"
    )
    [plugin] = build_plugins(config)
    assert isinstance(plugin, HostDevicePlugin)
    assert plugin.resource_name == "example.com/fpga-u250.v2"
    assert plugin.cdi_kind == "acme.io/fpga-u250-v2"
