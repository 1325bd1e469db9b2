"""A DraDriver subclass served both ways from one class, in one process: as a device
plugin and as a DRA driver, with its prepare / unprepare hooks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from devplug import Device, DeviceNode
from devplug.framework.daemon import Daemon
from devplug.framework.device import ContainerEdits
from devplug.framework.dra import ClaimRef, DraDriver, DraService, DraSettings, Driver
from devplug.framework.dra.claims import FileClaims
from devplug.simulator import Kubelet
from tests.dra_helpers import NODE, NodeDirs, allocated_claim, claim_pod
from tests.sim_helpers import pod

RESOURCE = "example.com/widget"
DRIVER = "widget.example.com"


class Widgets(DraDriver):
    resource_name = RESOURCE
    ids_env = "WIDGETS"

    def __init__(self, nodes: Path) -> None:
        super().__init__(
            devices=[
                Device(
                    f"w{i}",
                    nodes=[DeviceNode(str(nodes / f"w{i}"))],
                    attributes={"model": "w-100", "index": i},
                )
                for i in range(2)
            ]
        )
        self.unprepared: list[str] = []

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        edits = await super().prepare(claim, devices)
        edits.env["WIDGET_CLAIM"] = f"{claim.namespace}/{claim.name}"
        return edits

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        self.unprepared += [d.id for d in devices]


def test_driver_name_defaults_to_the_resource_domain(tmp_path: Path) -> None:
    widgets = Widgets(tmp_path)
    assert widgets.driver_name == DRIVER
    assert Driver.of(widgets).name == DRIVER
    with pytest.raises(ValueError, match="driver name"):
        DraDriver(RESOURCE, [], driver_name="Widgets!")


async def test_one_class_serves_as_device_plugin_and_dra_driver(short_tmp: Path) -> None:
    dirs = NodeDirs(short_tmp)
    dirs.claims.mkdir(parents=True)
    claim = allocated_claim("wc", "uid-w", ["w1"])
    for result in claim["status"]["allocation"]["devices"]["results"]:
        result["driver"] = DRIVER
    (dirs.claims / "wc.yaml").write_text(yaml.safe_dump(claim))

    widgets = Widgets(dirs.dev)
    service = DraService(
        [Driver.of(widgets)],
        DraSettings(
            node_name=NODE,
            registry_dir=dirs.registry,
            plugins_dir=dirs.plugins,
            cdi_dir=dirs.cdi,
            claims_dir=dirs.claims,
        ),
    )
    stop = asyncio.Event()
    daemon = asyncio.create_task(Daemon([widgets], dirs.plugin_dir, services=[service]).run(stop))
    try:
        async with Kubelet(
            dirs.plugin_dir,
            dirs.state_dir,
            control_socket=False,
            dra_registry_dir=dirs.registry,
            claims=FileClaims(dirs.claims),
        ) as kubelet:
            await kubelet.wait_for_resource(RESOURCE, count=2)
            await kubelet.wait_for_registration(DRIVER)
            [counted] = await kubelet.apply(pod("counted", {"app": {RESOURCE: 1}}))
            assert counted.admitted
            assert len(counted.containers[0].devices[RESOURCE]) == 1
            [described] = await kubelet.apply(claim_pod("described", "wc"))
            assert described.admitted, described.message
            [cdi] = described.containers[0].options.cdi_devices
            assert cdi == f"{DRIVER}/claim=uid-w-w1"
            spec = json.loads((dirs.cdi / f"{DRIVER}-uid-w.json").read_text())
            assert "WIDGET_CLAIM=default/wc" in spec["containerEdits"]["env"]
            assert "WIDGETS=w1" in spec["containerEdits"]["env"]
            assert await kubelet.delete_pod("described")
            assert widgets.unprepared == ["w1"]
    finally:
        stop.set()
        await daemon
