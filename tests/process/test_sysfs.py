"""USB and PCI devices selected in fake sysfs trees laid out like the kernel's, served by
a real `devplug serve`: nodes found through sysfs, NUMA, vfio-pci the KubeVirt way,
per-model pools, hot-plug while serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hw_helpers import (
    SERIAL,
    WEBCAM,
    add_u250,
    hardware_config,
    roots,
    standard_tree,
    validate_cdi,
    wait_file,
)
from sim_helpers import devplug

from devplug.fakes.sysfs import FakeSysfs, Node, UsbInterface, make_node
from devplug.testing import KubeletHarness


def check_json(config: Path) -> dict[str, dict[str, object]]:
    result = devplug("check", "--config", str(config), "--output", "json")
    assert result.returncode == 0, result.stderr
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
        "  - {name: example.com/xhci, groups: [{pci: {class: '0x0c03'}}]}\n"
    )
    config.write_text(hardware_config(tree, named))
    report = check_json(config)
    dev = tree.dev
    [key_device] = report["example.com/key"]["devices"]  # type: ignore[misc]
    assert key_device["hostPaths"] == [f"{dev}/bus/usb/001/009", f"{dev}/hidraw0"]
    [camera] = report["example.com/camera"]["devices"]  # type: ignore[misc]
    assert camera["hostPaths"][-1] == f"{dev}/snd/controlC1"
    # The USB controller: none of its root hub's or USB devices' nodes.
    [xhci] = report["example.com/xhci"]["devices"]  # type: ignore[misc]
    assert (xhci["id"], xhci["hostPaths"]) == ("0000:00:14.0", [])
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


def test_fake_trees_are_laid_out_like_the_kernels(tmp_path: Path) -> None:
    """The paths the kernel makes, which discovery must read (not ones it invented)."""
    tree = standard_tree(tmp_path)
    tree.add_usb(
        "1-5",
        "1050",
        "0407",
        devnum=8,
        interfaces=[UsbInterface("03", [Node("hidraw", "hidraw0", 240, 0)])],
    )
    tree.add_usb(
        "1-6",
        "2341",
        "0043",
        devnum=7,
        interfaces=[UsbInterface("02", [Node("tty", "ttyACM0", 166, 0)])],
    )
    sys_ = tree.sys
    resolved = {
        # usb-serial: the port device between the interface and its tty; cdc-acm: none.
        "bus/usb/devices/1-1:1.0/ttyUSB0/tty/ttyUSB0": "dev/char/188:0",
        "bus/usb/devices/1-6:1.0/tty/ttyACM0": "dev/char/166:0",
        "bus/usb/devices/1-2:1.0/video4linux/video0": "class/video4linux/video0",
        "bus/usb/devices/1-2:1.2/sound/card1/controlC1": "dev/char/116:10",
        "bus/usb/devices/1-5:1.0/0003:1050:0407.0001/hidraw/hidraw0": "class/hidraw/hidraw0",
        "bus/usb/devices/1-1": "dev/char/189:1",
        "bus/pci/devices/0000:3b:00.0/drm/card1": "dev/char/226:1",
        "kernel/iommu_groups/40/devices/0000:d8:00.0": "bus/pci/devices/0000:d8:00.0",
        "devices/virtual/vfio/40": "dev/char/243:40",
    }
    for path, link in resolved.items():
        assert os.path.realpath(sys_ / path) == os.path.realpath(sys_ / link), path
    assert os.readlink(sys_ / "bus/pci/devices/0000:3b:00.0") == (
        "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    )
    pci = sys_ / "bus/pci/devices/0000:d8:00.0"
    assert os.readlink(pci / "iommu_group") == "../../../../kernel/iommu_groups/40"
    assert os.readlink(pci / "driver") == "../../../../bus/pci/drivers/vfio-pci"
    assert (pci / "numa_node").read_text() == "1\n"
    # Every device and class device names its bus or class, and the links resolve.
    links = [p for p in sys_.rglob("*") if p.is_symlink()]
    assert {p.name for p in links if not p.exists()} == set()
    tty = sys_ / "class/tty/ttyUSB0"
    assert os.path.realpath(tty / "subsystem") == str((sys_ / "class/tty").resolve())
    port = tty.resolve().parent.parent  # the usb-serial port
    assert os.path.realpath(port / "subsystem") == str((sys_ / "bus/usb-serial").resolve())
    # Devices without a node have a uevent without DEVNAME; those with one name it.
    assert "DEVNAME" not in (pci / "uevent").read_text()
    assert "DEVNAME" not in (sys_ / "bus/usb/devices/1-1:1.0/uevent").read_text()
    own = (sys_ / "bus/usb/devices/1-1/uevent").read_text()
    assert "DEVTYPE=usb_device\n" in own
    assert "DEVNAME=bus/usb/001/002\n" in own
    assert (tree.dev / "ttyUSB0").is_char_device()


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


def test_vfio_devices_for_one_vm_with_cdi(kubelet: KubeletHarness) -> None:
    """Two vfio-pci devices for one VM: every address in PCI_RESOURCE_<RESOURCE>, also
    with CDI, whose per-device env would keep only the last one."""
    tree = standard_tree(kubelet.root / "hw")
    tree.add_pci(
        "0000:d9:00.0",
        "10ee",
        "500d",
        numa_node=1,
        driver="vfio-pci",
        iommu_group=41,
        bridge="0000:d7:00.0",
    )
    cdi = kubelet.root / "cdi"
    firmware = kubelet.root / "firmware"
    firmware.mkdir()
    # A selector with the options of any group: env, mounts, annotations.
    config = roots(tree) + (
        "resources:\n"
        "  - name: example.com/vm\n"
        "    groups:\n"
        "      - pci: {driver: vfio-pci}\n"
        "        env: {FIRMWARE: v2}\n"
        "        annotations: {example.com/passthrough: 'true'}\n"
        f"        mounts: [{{hostPath: {firmware}, containerPath: /fw, readOnly: true}}]\n"
        f"    cdi: {{mode: both, dir: {cdi}}}\n"
    )
    kubelet.start_serve(config)
    pod = kubelet.admit({"example.com/vm": 2})
    assert pod.admitted, pod
    assert pod.env()["PCI_RESOURCE_EXAMPLE_COM_VM"] == "0000:d8:00.0,0000:d9:00.0"
    assert pod.env()["FIRMWARE"] == "v2"
    assert pod.annotations() == {"example.com/passthrough": "true"}
    assert pod.mounts() == {"/fw": str(firmware)}
    assert sorted(pod.device_nodes()) == ["/dev/vfio/40", "/dev/vfio/41", "/dev/vfio/vfio"]
    assert sorted(pod.cdi_devices()) == [
        "example.com/vm=0000:d8:00.0",
        "example.com/vm=0000:d9:00.0",
    ]
    text = wait_file(cdi / "devplug-example.com_vm.json", lambda t: t is not None)
    spec = json.loads(text or "")
    validate_cdi(spec)
    mount = {"hostPath": str(firmware), "containerPath": "/fw"}
    assert [d["containerEdits"] for d in spec["devices"]] == [
        {
            "env": ["FIRMWARE=v2"],
            "mounts": [{**mount, "options": ["ro", "nosuid", "nodev", "bind"]}],
            "deviceNodes": [
                {
                    "path": "/dev/vfio/vfio",
                    "hostPath": f"{tree.dev}/vfio/vfio",
                    "permissions": "rw",
                },
                {
                    "path": f"/dev/vfio/{group}",
                    "hostPath": f"{tree.dev}/vfio/{group}",
                    "permissions": "rw",
                },
            ],
        }
        for group in (40, 41)
    ]


def test_pools_by_the_values_found_at_start(kubelet: KubeletHarness) -> None:
    """`split` without `models`: one resource per value among the devices there."""
    tree = standard_tree(kubelet.root / "hw")
    config = roots(tree) + textwrap.dedent(
        """\
        resources:
          - {name: example.com/fpga, groups: [{pci: {vendor: "10ee"}}], split: {by: productID}}
          - {name: example.com/acc, groups: [{pci: {vendor: "10ee"}}], split: {by: driver}}
        """
    )
    kubelet.start_serve(config)
    assert kubelet.device_ids("example.com/fpga-0x500c") == ["0000:3b:00.0"]
    assert kubelet.device_ids("example.com/acc-xclmgmt") == ["0000:3b:00.0"]
    assert kubelet.device_ids("example.com/acc-vfio-pci") == ["0000:d8:00.0"]
    pod = kubelet.admit({"example.com/fpga-0x500d": 1})
    assert pod.admitted, pod
    assert pod.env()["PCI_RESOURCE_EXAMPLE_COM_FPGA-0X500D"] == "0000:d8:00.0"


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


@pytest.fixture
def pci_uevent() -> Path:
    """The uevent file of a PCI device (skipped where none may be written)."""
    devices = sorted(Path("/sys/bus/pci/devices").glob("*"))
    if not devices or not os.access(devices[0] / "uevent", os.W_OK):
        pytest.skip("no writable PCI uevent file in /sys")
    return devices[0] / "uevent"


async def test_kernel_uevents_reach_the_watcher(pci_uevent: Path) -> None:
    """The netlink path of a mounted sysfs: a uevent (a synthetic 'change' of a PCI
    device, which changes nothing) wakes the watcher."""
    import asyncio

    from devplug.sources.sysfs.udev import UdevEvents

    woken = asyncio.Event()
    events = UdevEvents.start(woken.set)
    if events is None:
        pytest.skip("netlink uevents are refused here")
    try:
        await asyncio.to_thread(pci_uevent.write_text, "change")
        async with asyncio.timeout(10):
            await woken.wait()
    finally:
        events.close()


async def test_without_pyudev_the_fallback_is_said_once_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    from devplug.sources.sysfs import udev

    monkeypatch.setitem(sys.modules, "pyudev", None)  # as if not installed
    monkeypatch.setattr(udev, "_said", set())

    with caplog.at_level("WARNING", logger="devplug.sources.sysfs.udev"):
        for _resource in range(3):  # each resource of the config starts its watcher
            assert udev.UdevEvents.start(lambda: None) is None
    [line] = caplog.messages
    assert "pip install 'devplug[udev]'" in line
    assert "hot-plug is seen through /dev only" in line


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


def test_roots_from_flags(tmp_path: Path) -> None:
    tree = standard_tree(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: example.com/serial, groups: [{usb: {vendor: '0403'}}]}]")
    flags = ("--sysfs-root", str(tree.sys), "--dev-root", str(tree.dev))
    result = devplug("check", "--config", str(config), *flags)
    assert result.returncode == 0, result.stderr
    assert f"usb-FT4ABC  Healthy  numa 0  {tree.dev}/bus/usb/001/002" in result.stdout


def test_a_selected_device_without_a_node_is_named_by_check_and_in_the_log(
    tmp_path: Path,
) -> None:
    """virtio-rng: its /dev/hwrng is a misc-class node, not below the PCI device in sysfs.
    Served as selected (env, attributes), with a warning saying how to add the node."""
    tree = FakeSysfs(tmp_path)
    tree.add_pci("0000:00:05.0", "1af4", "1044", pci_class="0xffff00", driver="virtio-pci")
    make_node(tree.dev / "hwrng")
    config = tmp_path / "c.yaml"
    config.write_text(
        roots(tree)
        + "resources:\n"
        + "  - {name: example.com/rng, groups: [{pci: {vendor: '1af4', device: '1044'}}]}\n"
        + "  - name: example.com/rng-node\n"
        + "    groups: [{pci: {vendor: '1af4', device: '1044'}, paths: [{path: /dev/hwrng}]}]\n"
    )
    report = check_json(config)
    bare, named = report["example.com/rng"], report["example.com/rng-node"]
    [device] = bare["devices"]  # type: ignore[misc]
    assert (device["id"], device["health"], device["hostPaths"]) == ("0000:00:05.0", "Healthy", [])
    assert bare["warnings"] == [
        "example.com/rng: device 0000:00:05.0 (1af4:1044) has no device node under it in "
        "sysfs: containers get none from it; to give them one, name it by path in "
        "groups[0].paths"
    ]
    [device] = named["devices"]  # type: ignore[misc]
    assert device["hostPaths"] == [f"{tree.dev}/hwrng"]
    assert named["warnings"] == []
    text = devplug("check", "--config", str(config))
    assert (
        "  warning: example.com/rng: device 0000:00:05.0 (1af4:1044) has no device" in text.stdout
    )

    with KubeletHarness() as kubelet:
        served = kubelet.start_serve(config)
        assert kubelet.device_ids("example.com/rng") == ["0000:00:05.0"]
        assert served.stop() == 0
        assert "example.com/rng: device 0000:00:05.0 (1af4:1044) has no device" in served.output
