"""Preferred-allocation policies per resource (numa, pack, spread, pci), through the
kubelet simulator's preferred allocation and topology manager, on fake PCI trees."""

from __future__ import annotations

import random
import textwrap

import pytest
from hw_helpers import roots

from devplug.fakes.sysfs import FakeSysfs
from devplug.framework.device import Device
from devplug.framework.preferred import _spread_order, pick, spread_replicas
from devplug.testing import KubeletHarness


def tree_of_switches(kubelet: KubeletHarness) -> FakeSysfs:
    tree = FakeSysfs(kubelet.root / "hw")
    # Four accelerators on NUMA node 0, two behind each of two switches.
    for address, bridge in (
        ("0000:3b:00.0", "0000:3a:00.0"),
        ("0000:3c:00.0", "0000:3a:00.0"),
        ("0000:5e:00.0", "0000:5d:00.0"),
        ("0000:5f:00.0", "0000:5d:00.0"),
    ):
        tree.add_pci(address, "1d0f", "1111", numa_node=0, bridge=bridge)
    for address in ("0000:81:00.0", "0000:82:00.0"):
        tree.add_pci(address, "1d0f", "2222", numa_node=1, bridge="0000:80:01.0")
    for address, numa in (("0000:17:00.0", 0), ("0000:a1:00.0", 1), ("0000:a2:00.0", 1)):
        tree.add_pci(address, "1d0f", "3333", numa_node=numa, bridge=f"0000:{address[5:7]}:01.0")
    return tree


def config(tree: FakeSysfs) -> str:
    return roots(tree) + textwrap.dedent(
        """\
        resources:
          - {name: example.com/near, preferred: pci, groups: [{pci: {device: "1111"}}]}
          - {name: example.com/packed, preferred: pack, count: 2,
             groups: [{pci: {device: "2222"}}]}
          - {name: example.com/spread, preferred: spread, count: 2,
             groups: [{pci: {device: "2222"}}]}
          - {name: example.com/numa, groups: [{pci: {device: "3333"}}]}
        """
    )


@pytest.mark.kubelet(topology_policy="single-numa-node")
def test_policies_through_the_kubelet(kubelet: KubeletHarness) -> None:
    kubelet.start_serve(config(tree_of_switches(kubelet)))

    # pci: after one device is taken, a pair behind one switch beats the kubelet's order.
    first = kubelet.admit({"example.com/near": 1})
    assert first.devices()["example.com/near"] == ["0000:3b:00.0"]
    pair = kubelet.admit({"example.com/near": 2})
    assert pair.admitted, pair
    assert pair.devices()["example.com/near"] == ["0000:5e:00.0", "0000:5f:00.0"]

    # pack: both shares of one device; spread: one share of each.
    packed = kubelet.admit({"example.com/packed": 2})
    assert packed.devices()["example.com/packed"] == ["0000:81:00.0::0", "0000:81:00.0::1"]
    spread = kubelet.admit({"example.com/spread": 2})
    assert spread.devices()["example.com/spread"] == ["0000:81:00.0::0", "0000:82:00.0::0"]

    # numa (the default): the node that holds two, which single-numa-node admits.
    numa = kubelet.admit({"example.com/numa": 2})
    assert numa.admitted, numa
    assert numa.devices()["example.com/numa"] == ["0000:a1:00.0", "0000:a2:00.0"]


def test_policies_are_deterministic_and_keep_must_include() -> None:
    devices = [Device(f"d{i}::{k}", numa_nodes=[i % 2]) for i in range(3) for k in range(2)]
    paths = {"d0": ("a", "x"), "d1": ("b", "y"), "d2": ("a", "z")}
    for policy in ("numa", "pack", "spread", "pci"):
        picks = {tuple(pick(policy, devices, [devices[5]], 3, paths)) for _ in range(3)}
        assert len(picks) == 1, policy
        [chosen] = picks
        assert chosen[0] == "d2::1", (policy, chosen)
        assert len(set(chosen)) == 3, (policy, chosen)
    assert pick("pack", devices, [devices[5]], 3) == ["d2::1", "d2::0", "d0::0"]
    assert pick("spread", devices, [devices[5]], 3) == ["d2::1", "d0::0", "d1::0"]
    assert pick("pci", devices, [devices[5]], 3, paths) == ["d2::1", "d2::0", "d0::0"]


def test_spread_replicas_keeps_the_order_of_plain_devices_as_in_general() -> None:
    rng = random.Random(7)
    for _ in range(300):
        names = [
            f"d{rng.randrange(6)}" + rng.choice(["", "", f"::{rng.randrange(2)}"])
            for _ in range(rng.randrange(8))
        ]
        devices = [Device(n) for n in names]
        taken = [Device(n) for n in rng.sample(names, min(len(names), rng.randrange(2)))]
        taken += [Device(f"t{rng.randrange(3)}")] if rng.random() < 0.3 else []
        assert spread_replicas(devices, taken) == _spread_order(devices, taken), (names, taken)
    plain = [Device(f"sim-{i}") for i in range(1000)]
    assert spread_replicas(plain, [Device("other")]) == plain
    assert [d.id for d in spread_replicas(plain[:3], [plain[0]])] == ["sim-1", "sim-2", "sim-0"]
