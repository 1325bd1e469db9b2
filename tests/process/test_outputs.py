"""Node feature file and CDI specs written by a real `devplug serve`, kept in step
with the devices, validated, removed on shutdown; CDI names in Allocate."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hw_helpers import validate_cdi, wait_file

from devplug.config.ids import path_device_id
from devplug.fakes.sysfs import make_node as mknod
from devplug.framework.cdi import qualified_name, spec_document
from devplug.framework.device import Device
from devplug.kube.names import label_name_problem, label_value
from devplug.outputs.nfd import HEADER, device_labels, parse_features
from devplug.testing import KubeletHarness


def config(tmp: Path) -> str:
    return f"""
nodeFeatures: {{path: {tmp}/features.d/devplug}}
resources:
  - name: example.com/widget
    allowAnyPath: true
    count: 2
    groups:
      - paths: [{{path: '{tmp}/dev/w*'}}]
        numaNode: 1
        attributes: {{model: "Widget X1", vendor: Acme}}
        env: {{WIDGET: "on"}}
    cdi: {{dir: {tmp}/cdi, mode: both}}
  - name: example.com/gadget
    allowAnyPath: true
    groups:
      - paths: [{{path: '{tmp}/dev/g0'}}]
        mounts: [{{hostPath: {tmp}/lib, containerPath: /lib/gadget, readOnly: true}}]
    cdi: {{dir: {tmp}/cdi, mode: cdi, kind: acme.io/gadget}}
  - name: example.com/fake
    virtual: 3
"""


def test_feature_file_and_cdi_specs_follow_the_devices(kubelet: KubeletHarness) -> None:
    tmp = kubelet.root / "hw"
    (tmp / "dev").mkdir(parents=True)
    (tmp / "lib").mkdir()
    mknod(tmp / "dev" / "w0")
    mknod(tmp / "dev" / "g0")
    features = tmp / "features.d" / "devplug"
    widget_spec = tmp / "cdi" / "devplug-example.com_widget.json"
    gadget_spec = tmp / "cdi" / "devplug-acme.io_gadget.json"
    process = kubelet.start_serve(config(tmp))

    text = wait_file(features, lambda t: t is not None and "widget.count=1" in t)
    assert text is not None
    assert parse_features(text) == {
        "example.com/fake.count": "3",
        "example.com/gadget.count": "1",
        "example.com/widget.count": "1",
        "example.com/widget.model": "Widget-X1",
        "example.com/widget.numa-nodes": "1",
        "example.com/widget.vendor": "Acme",
    }
    w0, w1, g0 = (path_device_id(f"{tmp}/dev/{n}") for n in ("w0", "w1", "g0"))
    spec = json.loads(wait_file(widget_spec, lambda t: t is not None) or "")
    validate_cdi(spec)
    assert spec["kind"] == "example.com/widget"
    assert spec["devices"] == [
        {
            "name": w0,
            "containerEdits": {
                "deviceNodes": [
                    {"path": f"{tmp}/dev/w0", "hostPath": f"{tmp}/dev/w0", "permissions": "rw"}
                ],
                "env": ["WIDGET=on"],
            },
        }
    ]
    gadget = json.loads(wait_file(gadget_spec, lambda t: t is not None) or "")
    validate_cdi(gadget)
    assert gadget["devices"][0]["containerEdits"]["mounts"] == [
        {
            "hostPath": f"{tmp}/lib",
            "containerPath": "/lib/gadget",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]

    # A new device: both files follow.
    mknod(tmp / "dev" / "w1")
    wait_file(features, lambda t: t is not None and "widget.count=2" in t)
    spec = json.loads(
        wait_file(widget_spec, lambda t: t is not None and t.count('"name"') == 2) or ""
    )
    validate_cdi(spec)
    assert [d["name"] for d in spec["devices"]] == [w0, w1]

    # Allocate: 'both' gives device nodes and CDI names, 'cdi' leaves nodes to CDI.
    pod = kubelet.admit({"example.com/widget": 2, "example.com/gadget": 1})
    assert pod.admitted, pod
    assert sorted(pod.cdi_devices()) == [
        f"acme.io/gadget={g0}",
        f"example.com/widget={w0}",
        f"example.com/widget={w1}",
    ]
    assert set(pod.device_nodes()) == {f"{tmp}/dev/w0", f"{tmp}/dev/w1"}
    assert pod.mounts() == {}

    # A device removed: the count of healthy devices drops.
    os.unlink(tmp / "dev" / "w1")
    wait_file(features, lambda t: t is not None and "widget.count=1" in t)

    assert process.stop() == 0
    assert not features.exists()
    assert not widget_spec.exists()
    assert not gadget_spec.exists()


def test_labels_and_specs_of_any_devices() -> None:
    devices = [
        Device("a::0", numa_nodes=[0], attributes={"model": "U250", "vendor": "Xilinx"}),
        Device("a::1", numa_nodes=[0], attributes={"model": "U250", "vendor": "Xilinx"}),
        Device("b", False, numa_nodes=[1], attributes={"model": "U280", "vendor": "Xilinx"}),
    ]
    assert device_labels("example.com/fpga", devices) == {
        "example.com/fpga.count": "1",
        "example.com/fpga.model": "U250.U280",
        "example.com/fpga.vendor": "Xilinx",
        "example.com/fpga.numa-nodes": "0_1",
    }
    assert label_value(" Alveo U280 (rev 2) ") == "Alveo-U280-rev-2"
    assert label_name_problem("example.com/fpga-u280.numa-nodes") is None
    assert label_name_problem("fpga.count") is None
    assert label_name_problem(f"example.com/{'x' * 53}.numa-nodes") is not None
    assert label_name_problem("Example.com/fpga.count") is not None
    assert len(label_value("x" * 100)) == 63
    document = spec_document("example.com/fpga", devices)
    validate_cdi(document)
    assert [d["name"] for d in document["devices"]] == ["a", "b"]
    assert qualified_name("example.com/fpga", "a::1") == "example.com/fpga=a"


async def test_services_work_for_any_plugin(short_tmp: Path) -> None:
    """The feature file and CDI specs of a plugin written in Python, not from a config:
    its own `node_labels()`, its devices' edits; and a daemon with no plugin at all."""
    import asyncio

    from hw_helpers import wait_for_file

    from devplug.framework.daemon import Daemon
    from devplug.framework.device import DeviceNode
    from devplug.framework.plugin import Plugin
    from devplug.outputs.cdi import CdiSpecs
    from devplug.outputs.nfd import FeatureFile

    class Widgets(Plugin):
        def node_labels(self) -> dict[str, str]:
            # The second name is too long for a label: left out, not written for NFD.
            count = str(len(self.devices))
            return {"example.com/widget.count": count, f"example.com/{'w' * 60}.count": count}

    features = short_tmp / "features"
    cdi = short_tmp / "cdi"
    spec_path = cdi / "devplug-example.com_widget.json"
    plugin = Widgets("example.com/widget", [Device("w0", nodes=[DeviceNode("/dev/w0")])])

    stop = asyncio.Event()
    services = [
        FeatureFile(features),
        CdiSpecs({"example.com/widget": "example.com/widget"}, cdi),
    ]
    daemon = Daemon([plugin], short_tmp / "plugins", services=services)
    task = asyncio.create_task(daemon.run(stop))
    await wait_for_file(features, lambda t: t == HEADER + "example.com/widget.count=1\n")
    plugin.publish([Device("w0"), Device("w1", nodes=[DeviceNode("/dev/w1")])])
    await wait_for_file(features, lambda t: t == HEADER + "example.com/widget.count=2\n")
    text = await wait_for_file(spec_path, lambda t: t is not None and "w1" in t)
    validate_cdi(json.loads(text or ""))
    stop.set()
    await task
    assert not features.exists()
    assert not spec_path.exists()

    # No plugins: a file of no labels, kept until shutdown.
    stop = asyncio.Event()
    task = asyncio.create_task(
        Daemon([], short_tmp / "plugins", services=[FeatureFile(features)]).run(stop)
    )
    await wait_for_file(features, lambda t: t == HEADER)
    stop.set()
    await task
    assert not features.exists()


async def test_a_file_that_cannot_be_written_does_not_stop_serving(short_tmp: Path) -> None:
    import asyncio
    import logging

    from devplug.framework.daemon import Daemon
    from devplug.framework.plugin import Plugin
    from devplug.outputs.cdi import CdiSpecs
    from devplug.outputs.nfd import FeatureFile

    blocker = short_tmp / "not-a-folder"
    blocker.write_text("")
    plugin = Plugin("example.com/widget", [Device("w0")])
    warned: list[str] = []

    both = asyncio.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())
            if len(warned) == 2:
                both.set()

    handler = Catch(logging.WARNING)
    logging.getLogger("devplug.outputs").addHandler(handler)
    try:
        stop = asyncio.Event()
        services = [
            FeatureFile(blocker / "devplug"),
            CdiSpecs({"example.com/widget": "example.com/widget"}, blocker / "cdi"),
        ]
        task = asyncio.create_task(
            Daemon([plugin], short_tmp / "plugins", services=services).run(stop)
        )
        async with asyncio.timeout(10):
            await both.wait()
        assert not task.done()  # still serving
        stop.set()
        await task
    finally:
        logging.getLogger("devplug.outputs").removeHandler(handler)
    assert sorted(w.split(":")[0] for w in warned) == [
        "cannot write node features to " + str(blocker / "devplug"),
        "example.com/widget",
    ]


def test_feature_file_from_the_flag(kubelet: KubeletHarness) -> None:
    features = kubelet.root / "nfd" / "devplug"
    process = kubelet.start_serve(
        "resources: [{name: example.com/fake, virtual: 2}]\n", "--feature-file", str(features)
    )
    assert wait_file(features, lambda t: t is not None) == HEADER + "example.com/fake.count=2\n"
    assert process.stop() == 0
    assert not features.exists()
