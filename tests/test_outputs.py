"""Node feature file and CDI specs written by a real `devplug serve`, kept in step
with the devices, validated, removed on shutdown; CDI names in Allocate."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hw_helpers import validate_cdi, wait_file

from devplug.framework.device import Device
from devplug.outputs.cdi import qualified_name, spec_document
from devplug.outputs.nfd import device_labels, label_value, parse_features
from devplug.sources.config import path_device_id
from devplug.testing import KubeletHarness
from devplug.testing.sysfs import make_node as mknod


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
    assert len(label_value("x" * 100)) == 63
    document = spec_document("example.com/fpga", devices)
    validate_cdi(document)
    assert [d["name"] for d in document["devices"]] == ["a", "b"]
    assert qualified_name("example.com/fpga", "a::1") == "example.com/fpga=a"
