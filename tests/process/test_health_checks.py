"""Health checks of selected devices, run by a real `devplug serve`: sysfs attributes,
files and commands, before a device is first listed and every interval after."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hw_helpers import hardware_config, standard_tree
from sim_helpers import devplug

from devplug.fakes.sysfs import Node, UsbInterface
from devplug.testing import KubeletHarness


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
    extra += (
        "  - name: example.com/checked-new\n"
        "    groups: [{usb: {serial: [NEW1, NEW2]}}]\n"
        "    health:\n"
        "      interval: 3600\n"
        f'      checks: [{{file: "{flag}-never"}}]\n'
    )
    kubelet.start_serve(hardware_config(tree, extra))
    checked = "example.com/checked"

    # Devices that come while serving are checked before they are listed.
    seq = kubelet.last_event_seq
    for n in (1, 2):
        tty = UsbInterface("ff", [Node("tty", f"ttyUSB{5 + n}", 188, 5 + n)])
        tree.add_usb(f"1-{5 + n}", "0403", "6001", serial=f"NEW{n}", devnum=9 + n, interfaces=[tty])
        kubelet.wait_until(
            lambda n=n: len(kubelet.device_ids("example.com/checked-new")) == n, what=f"NEW{n}"
        )
    assert kubelet.device_ids("example.com/checked-new", healthy=True) == []
    lists = [
        e.detail
        for e in kubelet.events()
        if e.seq > seq and e.kind == "devices" and e.resource == "example.com/checked-new"
    ]
    assert lists
    assert all(d.startswith("0/") for d in lists), lists
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


async def test_command_checks_time_out_and_never_use_a_shell() -> None:
    from devplug.config.hardware import CheckSpec
    from devplug.sources.health import check_problem
    from devplug.sources.hostdev import _Base

    base = _Base("dev0", (0, -2, "dev0"), (), None, {"serial": "a;touch x"})  # type: ignore[arg-type]
    values = {"id": "dev0", "serial": "a;touch x"}

    async def problem(command: list[str], timeout: float = 5) -> str | None:
        return await check_problem(CheckSpec(command=command, timeout=timeout), base, values)

    assert await problem(["true"]) is None
    assert await problem(["false"]) == "false exited 1"
    assert await problem(["sleep", "30"], timeout=0.2) == "sleep took longer than 0.2 s"
    assert await problem(["/no/such/program"]) is not None
    # A placeholder is one argument, never shell syntax.
    assert await problem(["test", "{serial}", "=", "a;touch x"]) is None


def test_check_runs_the_checks_once(tmp_path: Path) -> None:
    tree = standard_tree(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(
        hardware_config(tree)
        + "  - name: example.com/checked\n"
        + "    groups: [{pci: {vendor: '10ee'}}]\n"
        + "    health: {checks: [{attribute: vendor}, {attribute: numa_node, value: '0'}]}\n"
    )
    result = devplug("check", "--config", str(config), "--output", "json")
    assert result.returncode == 0, result.stderr
    [checked] = [
        r for r in json.loads(result.stdout)["resources"] if r["name"] == "example.com/checked"
    ]
    assert [(d["id"], d["health"]) for d in checked["devices"]] == [
        ("0000:3b:00.0", "Healthy"),
        ("0000:d8:00.0", "Unhealthy"),
    ]
