"""`devplug status` against the simulator's PodResources API and a real `devplug serve`."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from sim_helpers import devplug

from devplug.testing import KubeletHarness


def status(kubelet: KubeletHarness, *extra: str) -> tuple[int, str, str]:
    socket = kubelet.state_dir / "pod-resources" / "kubelet.sock"
    done = devplug(
        "status", "--pod-resources", str(socket), "--plugin-dir", str(kubelet.plugin_dir), *extra
    )
    return done.returncode, done.stdout, done.stderr


def test_status_shows_devices_health_and_holders(short_tmp: Path) -> None:
    nodes = short_tmp / "dev"
    nodes.mkdir()
    for i in range(2):
        os.mknod(nodes / f"w{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    config = (
        "resources:\n"
        "  - {name: example.com/fake, virtual: 3}\n"
        "  - name: example.com/widget\n"
        "    allowAnyPath: true\n"
        f"    groups: [{{paths: [{{path: '{nodes}/w*'}}]}}]\n"
    )
    with KubeletHarness() as kubelet:
        kubelet.start_serve(config)
        pod = kubelet.admit({"example.com/fake": 2}, name="trainer", namespace="ml")
        assert pod.admitted, pod
        held = pod.devices()["example.com/fake"]
        widget = kubelet.admit({"example.com/widget": 1}, name="w")
        (widget_id,) = widget.devices()["example.com/widget"]
        # The held widget's node goes: the kubelet stops offering it, the plugin says why.
        os.unlink(next(n for n in nodes.iterdir() if widget_id.endswith(n.name)))
        kubelet.wait_for_resource("example.com/widget", count=1)

        code, out, err = status(kubelet, "--output", "json")
        assert code == 0, err
        report = json.loads(out)
        resources = {r["name"]: r for r in report["resources"]}
        assert set(resources) == {"example.com/fake", "example.com/widget"}
        fake = resources["example.com/fake"]
        assert fake["healthSource"] == "plugin"
        assert (fake["allocatable"], fake["allocated"]) == (3, 2)
        holders = {
            d["id"]: [(h["namespace"], h["pod"], h["container"]) for h in d["holders"]]
            for d in fake["devices"]
        }
        assert holders == {
            i: ([("ml", "trainer", "main")] if i in held else [])
            for i in kubelet.device_ids("example.com/fake")
        }
        widgets = {d["id"]: d for d in resources["example.com/widget"]["devices"]}
        assert widgets[widget_id]["health"] == "Unhealthy"
        assert widgets[widget_id]["allocatable"] is False
        assert widgets[widget_id]["holders"] == [
            {"namespace": "default", "pod": "w", "container": "main"}
        ]

        code, out, _ = status(kubelet)
        assert code == 0
        assert "example.com/fake: 3 devices, 3 allocatable, 2 allocated" in out
        rows = {
            line.split()[0]: line.split()[1:]
            for line in out.splitlines()[1:]
            if line.startswith("  ")
        }
        assert rows[held[0]] == ["Healthy", "ml/trainer/main"]
        assert rows[widget_id] == ["Unhealthy", "default/w/main"]


def test_status_without_a_plugin_socket_takes_health_from_the_kubelet(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet:
        kubelet.start_serve("resources:\n  - {name: example.com/fake, virtual: 2}\n")
        done = devplug(
            "status",
            "--pod-resources",
            str(kubelet.state_dir / "pod-resources" / "kubelet.sock"),
            "--plugin-dir",
            str(short_tmp),
            "--output",
            "json",
        )
        assert done.returncode == 0, done.stderr
        (fake,) = json.loads(done.stdout)["resources"]
        assert fake["healthSource"] == "kubelet"
        assert [d["health"] for d in fake["devices"]] == ["Healthy", "Healthy"]


def test_status_without_a_kubelet_fails_with_one_line(short_tmp: Path) -> None:
    done = devplug("status", "--pod-resources", str(short_tmp / "kubelet.sock"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "cannot read the kubelet's PodResources API" in done.stderr
