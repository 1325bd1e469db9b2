"""USB and PCI devices selected in fake sysfs trees laid out like the kernel's, served by
a real `devplug serve`: nodes found through sysfs, NUMA, vfio-pci the KubeVirt way,
per-model pools, hot-plug while serving, health checks, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hw_helpers import add_u250, roots, standard_tree

from devplug.testing import KubeletHarness
from devplug.testing.sysfs import FakeSysfs, Node, UsbInterface, make_node

SERIAL = "example.com/serial"
WEBCAM = "example.com/webcam"


def hardware_config(tree: FakeSysfs, extra: str = "") -> str:
    return (
        roots(tree)
        + textwrap.dedent(
            f"""\
        resources:
          - name: {SERIAL}
            groups:
              - usb: {{vendor: "0403", product: ["6010", "6011"]}}
          - name: {WEBCAM}
            groups:
              - usb: {{interfaceClass: "0x0e"}}
          - name: example.com/fpga
            groups:
              - pci: {{vendor: "10ee", class: "0x1200/0xff00"}}
            split: {{by: productID, models: {{"0x500c": u250, "0x500d": u280}}}}
        """
        )
        + extra
    )


def check_json(config: Path) -> dict[str, dict[str, object]]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "check",
            "--config",
            str(config),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {r["name"]: r for r in json.loads(result.stdout)["resources"]}


def test_devices_nodes_and_attributes_from_sysfs(tmp_path: Path) -> None:
    tree = standard_tree(tmp_path)
    make_node(tree.dev / "xclmgmt12")
    config = tmp_path / "c.yaml"
    # A driver's own node, named in the config from the device's attributes.
    # A security key (hidraw); the webcam by vendor: all its interfaces, sound too.
    key = UsbInterface("03", [Node("hidraw", "hidraw0", 240, 0)])
    tree.add_usb("1-5", "1050", "0407", serial="YK1", devnum=9, interfaces=[key])
    named = (
        "  - name: example.com/mgmt\n"
        "    groups:\n"
        "      - pci: {driver: xclmgmt}\n"
        '        paths: [{path: "/dev/xclmgmt{iommuGroup}", permissions: r}]\n'
        "  - {name: example.com/key, groups: [{usb: {vendor: '1050'}}]}\n"
        "  - {name: example.com/camera, groups: [{usb: {vendor: '046d'}}]}\n"
    )
    config.write_text(hardware_config(tree, named))
    report = check_json(config)
    dev = tree.dev
    [key_device] = report["example.com/key"]["devices"]  # type: ignore[misc]
    assert key_device["hostPaths"] == [f"{dev}/bus/usb/001/009", f"{dev}/hidraw0"]
    [camera] = report["example.com/camera"]["devices"]  # type: ignore[misc]
    assert camera["hostPaths"][-1] == f"{dev}/snd/controlC1"
    [mgmt] = report["example.com/mgmt"]["devices"]  # type: ignore[misc]
    assert mgmt["hostPaths"] == [f"{dev}/dri/card1", f"{dev}/dri/renderD128", f"{dev}/xclmgmt12"]
    assert mgmt["health"] == "Healthy"
    [serial] = report[SERIAL]["devices"]  # type: ignore[misc]
    assert serial["id"] == "usb-FT4ABC"
    assert serial["hostPaths"] == [f"{dev}/bus/usb/001/002", f"{dev}/ttyUSB0", f"{dev}/ttyUSB1"]
    assert serial["numaNodes"] == [0]  # the USB controller's
    assert serial["attributes"] == {
        "vendorID": "0x0403",
        "productID": "0x6010",
        "serial": "FT4ABC",
        "model": "Dual RS232-HS",
        "vendor": "FTDI",
        "numaNode": 0,
    }
    # The webcam by class: its video interfaces, not its audio one; the stick is ignored.
    [webcam] = report[WEBCAM]["devices"]  # type: ignore[misc]
    assert webcam["id"] == "usb-WC1"
    assert webcam["hostPaths"] == [f"{dev}/bus/usb/001/003", f"{dev}/video0", f"{dev}/video1"]
    assert webcam["attributes"]["usbInterfaceClass"] == "0x0e"
    # One entry, two models: one resource each, with the PCI attributes and NUMA node.
    [u250] = report["example.com/fpga-u250"]["devices"]  # type: ignore[misc]
    [u280] = report["example.com/fpga-u280"]["devices"]  # type: ignore[misc]
    assert (u250["id"], u250["numaNodes"], u250["hostPaths"]) == (
        "0000:3b:00.0",
        [0],
        [f"{dev}/dri/card1", f"{dev}/dri/renderD128"],
    )
    assert u250["attributes"] == {
        "pciAddress": "0000:3b:00.0",
        "vendorID": "0x10ee",
        "productID": "0x500c",
        "pciClass": "0x120000",
        "driver": "xclmgmt",
        "iommuGroup": 12,
        "numaNode": 0,
        "model": "u250",
    }
    # Bound to vfio-pci: the vfio container and its IOMMU group.
    assert (u280["id"], u280["numaNodes"]) == ("0000:d8:00.0", [1])
    assert u280["hostPaths"] == [f"{dev}/vfio/vfio", f"{dev}/vfio/40"]


def test_pools_hot_plug_and_vfio_through_the_kubelet(kubelet: KubeletHarness) -> None:
    tree = standard_tree(kubelet.root / "hw")
    process = kubelet.start_serve(hardware_config(tree))
    assert kubelet.device_ids(SERIAL) == ["usb-FT4ABC"]
    assert kubelet.device_ids("example.com/fpga-u250") == ["0000:3b:00.0"]

    # A pod asking for one model gets that model; a vfio device comes the KubeVirt way.
    pod = kubelet.admit({"example.com/fpga-u280": 1})
    assert pod.admitted, pod
    assert pod.env()["PCI_RESOURCE_EXAMPLE_COM_FPGA-U280"] == "0000:d8:00.0"
    assert pod.device_nodes() == {
        "/dev/vfio/vfio": f"{tree.dev}/vfio/vfio",
        "/dev/vfio/40": f"{tree.dev}/vfio/40",
    }
    pod = kubelet.admit({"example.com/fpga-u250": 1})
    assert pod.device_nodes() == {
        "/dev/dri/card1": f"{tree.dev}/dri/card1",
        "/dev/dri/renderD128": f"{tree.dev}/dri/renderD128",
    }
    assert "PCI_RESOURCE_EXAMPLE_COM_FPGA-U250" not in pod.env()

    # Hot-plug: a second adapter appears, then goes (Unhealthy, same ID), then returns.
    def second(port: str = "1-4", tty: int = 2) -> None:
        tree.add_usb(
            port,
            "0403",
            "6011",
            serial="FT9XYZ",
            devnum=5 + tty,
            interfaces=[UsbInterface("ff", [Node("tty", f"ttyUSB{tty}", 188, tty)])],
        )

    second()
    kubelet.wait_until(
        lambda: kubelet.device_ids(SERIAL, healthy=True) == ["usb-FT4ABC", "usb-FT9XYZ"],
        what="the new adapter",
    )
    tree.remove("1-4")
    kubelet.wait_until(
        lambda: kubelet.device_ids(SERIAL, healthy=False) == ["usb-FT9XYZ"],
        what="the unplugged adapter Unhealthy",
    )
    assert kubelet.device_ids(SERIAL) == ["usb-FT4ABC", "usb-FT9XYZ"]
    second("1-5", 3)  # back in another port, with another tty: the same device
    kubelet.wait_until(
        lambda: len(kubelet.device_ids(SERIAL, healthy=True)) == 2, what="the adapter back"
    )
    pod = kubelet.admit({SERIAL: 2})
    assert pod.admitted, pod
    assert f"{tree.dev}/ttyUSB3" in pod.device_nodes().values()
    assert kubelet.device_ids(SERIAL) == ["usb-FT4ABC", "usb-FT9XYZ"]

    # PCI hot-unplug and back.
    tree.remove("0000:3b:00.0")
    kubelet.wait_until(
        lambda: kubelet.device_ids("example.com/fpga-u250", healthy=False) == ["0000:3b:00.0"],
        what="the FPGA Unhealthy",
    )
    add_u250(tree)
    kubelet.wait_until(
        lambda: kubelet.device_ids("example.com/fpga-u250", healthy=True) == ["0000:3b:00.0"],
        what="the FPGA back",
    )
    assert process.stop() == 0


def test_health_checks(kubelet: KubeletHarness) -> None:
    tree = standard_tree(kubelet.root / "hw")
    flag = kubelet.root / "hw" / "ok"
    flag.touch()
    status = Path(os.path.realpath(tree.sys / "bus/pci/devices/0000:3b:00.0")) / "state"
    status.write_text("resetting\n")  # failing from the start
    extra = (
        "  - name: example.com/checked\n"
        "    groups:\n"
        '      - pci: {address: "3b:00.0"}\n'
        "    health:\n"
        "      interval: 0.1\n"
        "      checks:\n"
        "        - {attribute: state, value: ready}\n"
        f'        - {{file: "{flag}"}}\n'
        f'        - {{command: [test, -e, "{tree.sys}/bus/pci/devices/{{pciAddress}}"]}}\n'
    )
    kubelet.start_serve(hardware_config(tree, extra))
    checked = "example.com/checked"
    # Checked before the first list: never offered Healthy while failing.
    assert kubelet.device_ids(checked, healthy=False) == ["0000:3b:00.0"]
    status.write_text("ready\n")
    kubelet.wait_until(lambda: kubelet.device_ids(checked, healthy=True) == ["0000:3b:00.0"])
    status.write_text("resetting\n")
    kubelet.wait_until(lambda: kubelet.device_ids(checked, healthy=False) == ["0000:3b:00.0"])
    status.write_text("ready\n")
    kubelet.wait_until(lambda: kubelet.device_ids(checked, healthy=True) == ["0000:3b:00.0"])
    flag.unlink()
    kubelet.wait_until(lambda: kubelet.device_ids(checked, healthy=False) == ["0000:3b:00.0"])
    flag.touch()
    kubelet.wait_until(lambda: kubelet.device_ids(checked, healthy=True) == ["0000:3b:00.0"])


BAD = {
    "bad-hex": ('usb: {vendor: "04g3"}', "resources[0].groups[0].usb.vendor", "hex ID"),
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
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "serve",
            "--config",
            str(config),
            "--plugin-dir",
            str(tmp_path / "plugins"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
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


def test_udev_is_imported_only_for_the_real_sysfs(tmp_path: Path) -> None:
    """Real /sys makes no inotify events on hot-plug: udev netlink (pyudev) is used
    there, and only there."""
    tree = FakeSysfs(tmp_path)
    script = textwrap.dedent("""\
        import asyncio, sys
        from devplug.sources import build_plugins, parse_config

        async def main(root):
            text = f"sysfsRoot: {root}\\nresources: [{{name: example.com/x, "
            text += "groups: [{usb: {vendor: '0403'}}]}]"
            [plugin] = build_plugins(parse_config(text))
            task = asyncio.create_task(plugin.scan())
            await plugin.wait_published()
            task.cancel()
            print("pyudev" in sys.modules)

        if sys.argv[1] == "default":
            from devplug.sources import load_default_config
            plugins = build_plugins(load_default_config())
            async def scan_all():
                tasks = [asyncio.create_task(p.scan()) for p in plugins]
                await asyncio.gather(*(p.wait_published() for p in plugins))
                for task in tasks:
                    task.cancel()
                print("pyudev" in sys.modules or "jsonschema" in sys.modules)
            asyncio.run(scan_all())
        else:
            asyncio.run(main(sys.argv[1]))
    """)
    for root, expected in ((str(tree.sys), "False"), ("default", "False"), ("/sys", "True")):
        result = subprocess.run(
            [sys.executable, "-c", script, root], capture_output=True, text=True, timeout=30
        )
        assert result.stdout.strip() == expected, result.stderr


def test_command_checks_time_out_and_never_use_a_shell() -> None:
    import asyncio

    from devplug.sources.hardware import CheckSpec
    from devplug.sources.health import check_problem
    from devplug.sources.hostdev import _Base

    base = _Base("dev0", (0, -2, "dev0"), (), None, {"serial": "a;touch x"})  # type: ignore[arg-type]
    values = {"id": "dev0", "serial": "a;touch x"}

    def problem(command: list[str], timeout: float = 5) -> str | None:
        check = CheckSpec(command=command, timeout=timeout)
        return asyncio.run(check_problem(check, base, values))

    assert problem(["true"]) is None
    assert problem(["false"]) == "false exited 1"
    assert problem(["sleep", "30"], timeout=0.2) == "sleep took longer than 0.2 s"
    assert problem(["/no/such/program"]) is not None
    # A placeholder is one argument, never shell syntax.
    assert problem(["test", "{serial}", "=", "a;touch x"]) is None


def test_kernel_uevents_reach_the_watcher() -> None:
    """The netlink path of a mounted sysfs: a uevent (a synthetic 'change' of a PCI
    device, which changes nothing) wakes the watcher."""
    import asyncio

    from devplug.sources.sysfs.udev import UdevEvents

    devices = sorted(Path("/sys/bus/pci/devices").glob("*"))
    if not devices or not os.access(devices[0] / "uevent", os.W_OK):
        pytest.skip("no writable PCI uevent file in /sys")

    async def scenario() -> None:
        woken = asyncio.Event()
        events = UdevEvents.start(woken.set)
        if events is None:
            pytest.skip("netlink uevents are refused here")
        try:
            (devices[0] / "uevent").write_text("change")
            async with asyncio.timeout(10):
                await woken.wait()
        finally:
            events.close()

    asyncio.run(scenario())


def test_two_devices_with_one_serial(tmp_path: Path) -> None:
    tree = FakeSysfs(tmp_path)
    for port, tty in (("1-1", 0), ("1-2", 1)):
        interface = UsbInterface("ff", [Node("tty", f"ttyUSB{tty}", 188, tty)])
        tree.add_usb(port, "1a86", "7523", serial="0001", devnum=2 + tty, interfaces=[interface])
    config = tmp_path / "c.yaml"
    config.write_text(
        roots(tree) + "resources: [{name: example.com/ch340, groups: [{usb: {vendor: 1a86}}]}]"
    )
    [resource] = check_json(config).values()
    devices = resource["devices"]
    assert [(d["id"], d["hostPaths"][-1]) for d in devices] == [  # type: ignore[attr-defined]
        ("usb-0001", f"{tree.dev}/ttyUSB0"),
        ("usb-1-2", f"{tree.dev}/ttyUSB1"),
    ]
    assert resource["warnings"] == [  # type: ignore[comparison-overlap]
        "example.com/ch340: 1-2 has the serial of device 'usb-0001': it is served as 'usb-1-2'"
    ]


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


def test_roots_from_flags(tmp_path: Path) -> None:
    tree = standard_tree(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: example.com/serial, groups: [{usb: {vendor: '0403'}}]}]")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "devplug.cli.main", "check", "--config", str(config)),
            *("--sysfs-root", str(tree.sys), "--dev-root", str(tree.dev)),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert f"usb-FT4ABC  Healthy  numa 0  {tree.dev}/bus/usb/001/002" in result.stdout
