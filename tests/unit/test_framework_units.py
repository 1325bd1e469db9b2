"""The framework's pure parts: names, devices, edit merging, the preferred-allocation policy."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from devplug import ContainerEdits, Device, DeviceNode, Mount, merge_edits
from devplug.config.ids import device_id_problem
from devplug.framework.preferred import prefer_numa_local
from devplug.ground.files import remove_quietly, write_atomic
from devplug.kube.names import resource_name_problem


@pytest.mark.parametrize(
    "name",
    ["example.com/kvm", "nvidia.com/gpu", "a.b-c.io/x_y.z", "devplug.io/A1"],
)
def test_valid_resource_names(name: str) -> None:
    assert resource_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu", "no vendor domain"),
        ("kubernetes.io/gpu", "kubernetes.io"),
        ("foo.kubernetes.io/gpu", "kubernetes.io"),
        ("requests.example.com/gpu", "requests."),
        ("Example.com/gpu", "DNS subdomain"),
        ("example.com/", "after '/'"),
        ("example.com/-gpu", "after '/'"),
        ("example.com/a/b", "more than one"),
        ("example.com/" + "x" * 64, "after '/'"),
    ],
)
def test_invalid_resource_names(name: str, why: str) -> None:
    problem = resource_name_problem(name)
    assert problem is not None
    assert why in problem


def test_device_ids_are_checked() -> None:
    assert device_id_problem("x" * 63) is None
    assert "longer than 63" in (device_id_problem("x" * 64) or "")
    assert device_id_problem("a b") is not None
    assert device_id_problem("a,b") is not None
    with pytest.raises(ValueError, match="empty"):
        Device("")


def test_device_rejects_bad_parts() -> None:
    with pytest.raises(ValueError, match="permissions"):
        DeviceNode("/dev/x", permissions="rx")
    with pytest.raises(ValueError, match="permissions"):
        DeviceNode("/dev/x", permissions="rr")
    with pytest.raises(ValueError, match="not absolute"):
        DeviceNode("dev/x")
    with pytest.raises(ValueError, match="fully qualified"):
        Device("a", cdi_devices=["gpu0"])
    with pytest.raises(ValueError, match="NUMA"):
        Device("a", numa_nodes=[-1])


def test_device_defaults_and_immutability() -> None:
    device = Device("a", nodes=[DeviceNode("/dev/a")], env={"K": "v"}, numa_nodes=[1, 0, 1])
    assert device.nodes[0].container_path == "/dev/a"
    assert device.numa_nodes == (0, 1)
    with pytest.raises(TypeError):
        device.env["K"] = "w"  # type: ignore[index]
    assert device == Device("a", nodes=[DeviceNode("/dev/a")], env={"K": "v"}, numa_nodes=[0, 1])
    assert device.with_health(False).healthy is False
    assert device.with_health(True) is device
    with pytest.raises(AttributeError, match="immutable"):
        device.healthy = False  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del device.env


def test_a_replaced_device_is_checked_as_a_new_one() -> None:
    device = Device("a", env={"K": "v"}, attributes={"model": "x"})
    moved = device.replace(id="b", numa_nodes=[1])
    assert (moved.id, moved.numa_nodes, dict(moved.env)) == ("b", (1,), {"K": "v"})
    assert (device.id, device.numa_nodes) == ("a", ())
    with pytest.raises(ValueError, match="NUMA"):
        device.replace(numa_nodes=[-1])
    with pytest.raises(TypeError):
        device.replace(colour="red")


def test_a_device_pickles_and_shows_its_fields() -> None:
    device = Device("a", nodes=[DeviceNode("/dev/a")], env={"K": "v"}, health_reason="")
    assert pickle.loads(pickle.dumps(device)) == device
    copied = copy.deepcopy(device)
    assert copied == device
    assert copied is not device
    assert repr(device).startswith("Device(id='a', healthy=True, numa_nodes=(), nodes=(")


def test_container_edits_compare_by_value() -> None:
    edits = ContainerEdits(env={"K": "v"}, cdi_devices=["vendor.com/dev=a"])
    assert edits == ContainerEdits({"K": "v"}, [], [], {}, ["vendor.com/dev=a"])
    assert edits != ContainerEdits(env={"K": "w"})
    assert ContainerEdits().env is not ContainerEdits().env  # each its own
    edits.mounts.append(Mount("/lib/x"))
    assert "mounts=[Mount(host_path='/lib/x'" in repr(edits)


def test_merge_edits_dedups_and_joins() -> None:
    shared = DeviceNode("/dev/shared", permissions="r")
    a = Device(
        "a",
        nodes=[DeviceNode("/dev/a"), shared],
        mounts=[Mount("/lib/x", read_only=True)],
        env={"VISIBLE": "0", "MODE": "fast"},
        annotations={"k": "1"},
        cdi_devices=["vendor.com/dev=a"],
    )
    b = Device(
        "b",
        nodes=[DeviceNode("/dev/b"), shared],
        mounts=[Mount("/lib/x", read_only=True)],
        env={"VISIBLE": "1", "MODE": "fast"},
        annotations={"k": "2"},
        cdi_devices=["vendor.com/dev=b", "vendor.com/dev=a"],
    )
    edits = merge_edits([a, b])
    assert [n.host_path for n in edits.nodes] == ["/dev/a", "/dev/shared", "/dev/b"]
    assert [m.container_path for m in edits.mounts] == ["/lib/x"]
    assert edits.env == {"VISIBLE": "0,1", "MODE": "fast"}
    assert edits.annotations == {"k": "1,2"}
    assert edits.cdi_devices == ["vendor.com/dev=a", "vendor.com/dev=b"]


def _numa(ids_by_node: dict[int, list[str]]) -> list[Device]:
    return [Device(i, numa_nodes=[n]) for n, ids in ids_by_node.items() for i in ids]


def test_preferred_fills_from_one_node() -> None:
    devices = _numa({0: ["a0", "a1", "a2"], 1: ["b0", "b1"]})
    picked = prefer_numa_local(devices, [], 2)
    assert picked == ["b0", "b1"]  # the smallest node that fits, keeping node 0 whole


def test_preferred_follows_must_include() -> None:
    devices = _numa({0: ["a0", "a1", "a2"], 1: ["b0", "b1"]})
    picked = prefer_numa_local(devices, [devices[0]], 2)
    assert picked == ["a0", "a1"]


def test_preferred_spreads_over_few_nodes() -> None:
    devices = _numa({0: ["a0"], 1: ["b0", "b1", "b2"], 2: ["c0", "c1"]})
    picked = prefer_numa_local(devices, [], 4)
    assert len(picked) == 4
    assert set(picked) >= {"b0", "b1", "b2"}


def test_preferred_returns_must_include_when_enough() -> None:
    devices = _numa({0: ["a0", "a1"]})
    assert prefer_numa_local(devices, devices[1:], 1) == ["a1"]


def _replicas(spec: dict[str, int], numa: int = 0) -> list[Device]:
    return [Device(f"{p}::{k}", numa_nodes=[numa]) for p, n in spec.items() for k in range(n)]


def test_preferred_spreads_replicas_over_physical_devices() -> None:
    devices = _replicas({"a": 3, "b": 3})
    assert prefer_numa_local(devices, [], 2) == ["a::0", "b::0"]
    assert prefer_numa_local(devices, [devices[0]], 2) == ["a::0", "b::0"]
    assert prefer_numa_local(devices, [], 4) == ["a::0", "b::0", "a::1", "b::1"]


def test_preferred_takes_the_least_loaded_device_first() -> None:
    # a has one share left, b three: b is the less loaded device.
    devices = _replicas({"a": 1, "b": 3})
    assert prefer_numa_local(devices, [], 1) == ["b::0"]
    assert prefer_numa_local(devices, [], 2) == ["b::0", "a::0"]


def test_plain_ids_keep_the_offered_order() -> None:
    devices = [Device(i, numa_nodes=[0]) for i in ("d3", "d1", "d2")]
    assert prefer_numa_local(devices, [], 2) == ["d3", "d1"]


def test_device_attributes_describe_without_editing_containers() -> None:
    a = Device("fpga0", attributes={"model": "u280", "numa": 1, "vfio": True})
    assert dict(a.attributes) == {"model": "u280", "numa": 1, "vfio": True}
    assert a != Device("fpga0", attributes={"model": "u250", "numa": 1, "vfio": True})
    assert a == Device("fpga0", attributes={"vfio": True, "numa": 1, "model": "u280"})
    assert a.with_health(False).attributes == a.attributes
    assert merge_edits([a]).env == {}
    with pytest.raises(TypeError):
        a.attributes["model"] = "x"  # type: ignore[index]


def test_write_atomic_replaces_whole_files_and_skips_equal_content(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "features"
    assert write_atomic(target, "a=1\n")
    assert target.read_text() == "a=1\n"
    assert (target.stat().st_mode & 0o777) == 0o644
    before = target.stat().st_ino
    assert not write_atomic(target, b"a=1\n")  # same content: untouched
    assert target.stat().st_ino == before
    assert write_atomic(target, "a=2\n", mode=0o600)
    assert target.read_text() == "a=2\n"
    assert target.stat().st_ino != before  # a rename, not an in-place write
    assert (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["features"]  # no temp file left
    assert write_atomic(target, "a=3\n", durable=False)  # no syncs, still a rename
    assert target.read_text() == "a=3\n"
    remove_quietly(target)
    remove_quietly(target)
    assert not target.exists()
