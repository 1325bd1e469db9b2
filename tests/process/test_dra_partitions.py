"""Partitions and shared capacity in the slices a config gives: counter sets apart, a
shared device published once with its request policies, the API's limits kept, and a
bad partition or share said in one line. On the node: test_dra_partitions_node.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.framework.dra.slices import slice_bodies
from devplug.sources import ConfigError, build_plugins, parse_config
from devplug.sources.dradriver import config_driver
from tests.dra_helpers import (
    NODE,
    NodeDirs,
)

FPGA = "fpga.example.com"
GPU = "gpu.example.com"
SHARE_A = "3f1c1d2e-0000-4000-8000-00000000000a"
SHARE_B = "3f1c1d2e-0000-4000-8000-00000000000b"


def partition_config(dirs: NodeDirs, devices: int = 1) -> Path:
    """An FPGA resource of 4-slot cards offered in partitions of 1, 2 and 4 slots, and a
    GPU resource shared by memory (1 GiB steps) and by a link's bandwidth."""
    for i in range(devices):
        dirs.make_device(f"fpga{i}")
    dirs.make_device("gpu0")
    fpga = {
        "name": "example.com/fpga",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {"driver": FPGA, "partitions": {"slots": 4, "sizes": [1, 2, 4]}},
        "groups": [
            {"id": f"fpga{i}", "paths": [{"path": str(dirs.dev / f"fpga{i}")}]}
            for i in range(devices)
        ],
    }
    gpu = {
        "name": "example.com/gpu",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {
            "driver": GPU,
            "consumableCapacity": {
                "memory": {
                    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
                },
                "bandwidth": {
                    "value": "100G",
                    "requestPolicy": {"default": "10G", "validValues": ["10G", "25G", "50G"]},
                },
            },
        },
        "groups": [
            {
                "id": "gpu0",
                "paths": [{"path": str(dirs.dev / "gpu0")}],
                "attributes": {"memory": 40 << 30},
            }
        ],
    }
    config = dirs.root / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [fpga, gpu]}))
    return config


def slices_of(config: Path, driver: str) -> list[dict[str, Any]]:
    for plugin in build_plugins(parse_config(config.read_text(), str(config))):
        candidate = config_driver(plugin)
        if candidate.name == driver:
            plugin.publish(plugin.discover())
            return slice_bodies(candidate, NODE, generation=1)
    raise AssertionError(driver)


def test_slot_partitions_consume_a_counter_set_in_a_slice_of_its_own(short_tmp: Path) -> None:
    config = partition_config(NodeDirs(short_tmp))
    counters, devices = slices_of(config, FPGA)
    assert counters["metadata"]["name"] == "node-a-fpga-example-com-counters-0"
    assert "devices" not in counters["spec"]
    assert counters["spec"]["sharedCounters"] == [
        {"name": "fpga0", "counters": {f"slot-{i}": {"value": "1"} for i in range(4)}}
    ]
    assert counters["spec"]["pool"] == devices["spec"]["pool"]
    assert devices["spec"]["pool"]["resourceSliceCount"] == 2
    published = {d["name"]: d for d in devices["spec"]["devices"]}
    assert sorted(published) == [
        "fpga0-slot-0",
        "fpga0-slot-1",
        "fpga0-slot-2",
        "fpga0-slot-3",
        "fpga0-slots-0-1",
        "fpga0-slots-0-3",
        "fpga0-slots-2-3",
    ]
    half = published["fpga0-slots-2-3"]
    assert half["consumesCounters"] == [
        {"counterSet": "fpga0", "counters": {"slot-2": {"value": "1"}, "slot-3": {"value": "1"}}}
    ]
    assert half["attributes"] == {"slots": {"int": 2}, "firstSlot": {"int": 2}}


def test_a_shared_device_is_published_once_with_its_request_policies(short_tmp: Path) -> None:
    config = partition_config(NodeDirs(short_tmp))
    [body] = slices_of(config, GPU)
    [gpu] = body["spec"]["devices"]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"] == {
        "memory": {
            "value": str(40 << 30),
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        },
        "bandwidth": {
            "value": "100G",
            "requestPolicy": {"default": "10G", "validValues": ["10G", "25G", "50G"]},
        },
    }


def test_a_large_partitioned_pool_keeps_the_apis_limits(short_tmp: Path) -> None:
    """20 cards of 7 partitions: 140 partitions in slices of at most 64 (the limit for
    devices that consume counters), 20 counter sets in slices of at most 8."""
    config = partition_config(NodeDirs(short_tmp), devices=20)
    bodies = slices_of(config, FPGA)
    sets = [len(b["spec"]["sharedCounters"]) for b in bodies if "sharedCounters" in b["spec"]]
    devices = [len(b["spec"]["devices"]) for b in bodies if "devices" in b["spec"]]
    assert (sets, devices) == ([8, 8, 4], [64, 64, 12])
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {6}
    assert len({b["metadata"]["name"] for b in bodies}) == 6


BASE = {"name": "example.com/acc", "virtual": 2, "mode": "dra"}


@pytest.mark.parametrize(
    ("dra", "extra", "message"),
    [
        (
            {"partitions": {"slots": 4, "sizes": [1, 2]}},
            {"mode": "both"},
            "resources[0].dra.partitions: needs mode: dra (a device plugin hands out whole "
            "devices, never partitions)",
        ),
        (
            {"partitions": {"slots": 4, "sizes": [1]}},
            {"count": 2},
            "resources[0].dra.partitions: not with 'count'",
        ),
        ({"partitions": {"slots": 33, "sizes": [1]}}, {}, "resources[0].dra.partitions.slots"),
        ({"partitions": {"slots": 4, "sizes": [8]}}, {}, "resources[0].dra.partitions.sizes[0]"),
        (
            {"partitions": {"slots": 4, "counters": {"a": 1}}},
            {},
            "resources[0].dra.partitions: expected 'slots' (with 'sizes') or 'counters'",
        ),
        (
            {
                "partitions": {
                    "counters": {"Region_A": 1},
                    "devices": [{"name": "x", "consumes": {}}],
                }
            },
            {},
            "resources[0].dra.partitions.counters.Region_A: counter name 'Region_A' must be "
            "a lower-case DNS label",
        ),
        (
            {
                "partitions": {
                    "counters": {"r0": 1},
                    "devices": [{"name": "a", "consumes": {"r1": 1}}],
                }
            },
            {},
            "resources[0].dra.partitions.devices[0].consumes.r1: no counter 'r1' in 'counters'",
        ),
        (
            {
                "partitions": {
                    "counters": {"r0": 1},
                    "devices": [{"name": "a", "consumes": {"r0": 2}}],
                }
            },
            {},
            "resources[0].dra.partitions.devices[0].consumes.r0: expected 1 to 1, got 2",
        ),
        (
            {"partitions": {"slots": 2, "sizes": [1]}, "consumableCapacity": {"memory": {}}},
            {},
            "resources[0].dra: both 'partitions' and 'consumableCapacity' are set",
        ),
        (
            {"consumableCapacity": {"bandwidth": {}}},
            {},
            "resources[0].dra.consumableCapacity.bandwidth.value: required",
        ),
        (
            {"consumableCapacity": {"bandwidth": {"value": "lots"}}},
            {},
            "resources[0].dra.consumableCapacity.bandwidth.value: 'lots' is not a quantity",
        ),
        (
            {
                "consumableCapacity": {
                    "memory": {
                        "requestPolicy": {
                            "default": "1Gi",
                            "validRange": {"min": "1Gi", "step": "0"},
                        }
                    }
                }
            },
            {},
            "resources[0].dra.consumableCapacity.memory.requestPolicy.validRange.step: "
            "expected a quantity > 0",
        ),
    ],
)
def test_bad_partitions_and_shares_give_one_line(
    dra: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    text = yaml.safe_dump({"resources": [{**BASE, **extra, "dra": dra}]})
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml")
    assert str(error.value).startswith(f"c.yaml: {message}")
    assert "\n" not in str(error.value)
