"""A fleet from a cluster trace's node list (openb's columns), read as the planner reads
it: each node of the list a fleet node of its name, CPU and memory, its GPUs named as the
list names their model and served as shares for the scheduler extender, each node
publishing its GPUs under IDs of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug.config.errors import ConfigError
from devplug.fleet.hardware import build_pool
from devplug.fleet.nodelist import RESOURCE, node_list_fleet, unit
from devplug.fleet.shares import node_id
from devplug.placement.inventory import ASSIGNED, INVENTORY, decode

LIST = """sn,cpu_milli,memory_mib,gpu,model
n-0,64000,262144,2,P100
n-1,96000,393216,8,G2
n-2,64000,262144,2,P100
"""


def test_a_node_list_makes_one_pool_per_kind_of_node_with_the_lists_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(LIST)
    fleet = node_list_fleet(str(path))
    assert fleet.name == "nodes"
    assert [p.nodes for p in fleet.pools] == [("n-0", "n-2"), ("n-1",)]
    p100 = fleet.pools[0]
    assert (p100.spec.cpu, p100.spec.memory) == ("64000m", "262144Mi")
    assert p100.spec.gpus is not None
    assert (p100.spec.gpus.name, p100.spec.gpus.count) == ("P100", 2)


def test_each_node_publishes_its_gpus_as_shares_under_ids_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(LIST)
    pool = node_list_fleet(str(path)).pools[0]
    hardware = build_pool(pool, tmp_path / "work")
    assert hardware.capacity() == {RESOURCE: 2 * 1000 // unit()}
    assert hardware.placements is not None
    first = decode(hardware.placements.annotations("n-0")[INVENTORY])
    second = decode(hardware.placements.annotations("n-2")[INVENTORY])
    assert (first.resource, first.unit) == (RESOURCE, unit())
    assert [g.model for g in first.gpus] == ["P100", "P100"]
    assert not {g.id for g in first.gpus} & {g.id for g in second.gpus}
    # The pod being admitted on n-2 is matched to the pool's own GPU behind n-2's ID.
    pool_gpu = hardware.placements.inventory.gpus[1].id
    pod = {
        "metadata": {"name": "p", "uid": "u", "annotations": {ASSIGNED: node_id("n-2", pool_gpu)}}
    }
    with hardware.placements.admitting("n-2", pod):
        assert hardware.placements.current is not None
        assert hardware.placements.current.gpus == (pool_gpu,)
    assert hardware.placements.current is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("sn,cpu_milli,memory_mib,gpu,model\ncpu-0,8000,1024,0,\n", "node cpu-0: gpu: 0:"),
        ("sn,cpu_milli,memory_mib,gpu,model\nBad_Name,8000,1024,1,T4\n", "'Bad_Name': sn:"),
        ("sn,cpu_milli,memory_mib,gpu\nn-0,8000,1024,1\n", "column 'model' missing"),
    ],
)
def test_a_node_list_the_fleet_cannot_serve_is_refused_in_one_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        node_list_fleet(str(path))
    assert problem in str(error.value)
    assert "\n" not in str(error.value)
