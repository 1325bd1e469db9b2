"""The scheduler extender's pure parts: the GPU inventory a node publishes and its
one-line errors, the cluster state rebuilt from Nodes and pods, each policy's node and
GPU through the verbs (over the API's objects as plain data), and the 0-10 ranking."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from devplug.extender.state import MODELS, build, pod_demand
from devplug.extender.verbs import Extender, rank
from devplug.placement import Demand, TargetWorkload
from devplug.placement.inventory import (
    ASSIGNED,
    INVENTORY,
    Gpu,
    Inventory,
    InventoryError,
    decode,
    demand_of,
    ids,
    nvlink_groups,
)

RESOURCE = "devplug.io/gpu-milli"


def inventory(*gpus: str, model: str = "A100", unit: int = 1) -> Inventory:
    return Inventory(RESOURCE, unit, tuple(Gpu(g, model, nvlink=0, numa=0) for g in gpus))


def node_object(
    name: str, inv: Inventory, cpu: str = "32", memory: str = "128Gi"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {INVENTORY: inv.encode()}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def pod_object(
    name: str,
    milli: int,
    *,
    cpu: str = "1",
    assigned: str = "",
    node: str = "",
    models: str = "",
) -> dict[str, Any]:
    notes = {ASSIGNED: assigned} if assigned else {}
    if models:
        notes[MODELS] = models
    limits = {RESOURCE: str(milli)} if milli else {}
    spec: dict[str, Any] = {
        "schedulerName": "devplug-extender",
        "containers": [
            {
                "name": "main",
                "image": "docker.io/local/busybox:k8s",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": notes, "uid": f"uid-{name}"},
        "spec": spec,
    }


# -- the inventory -------------------------------------------------------------------


def test_an_inventory_reads_back_as_it_was_written_and_stays_small() -> None:
    written = Inventory(
        RESOURCE,
        10,
        (
            Gpu("GPU-a", "A100-SXM4-40GB", nvlink=0, numa=0),
            Gpu("GPU-b", "A100-SXM4-40GB", healthy=False, mig=("3g.20gb",), numa=1),
        ),
    )
    text = written.encode()
    assert decode(text) == written
    assert json.loads(text)["v"] == 1
    assert len(text) < 300
    assert written.milli_of(30) == 300


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "devplug.io/gpu-inventory: not JSON"),
        ('{"v": 2}', "devplug.io/gpu-inventory.v: version 2, this extender reads 1"),
        ('{"v":1,"resource":"r","unit":0,"gpus":[]}', ".unit: expected 1 to 1000, got 0"),
        ('{"v":1,"resource":"r","unit":1,"gpus":[3]}', ".gpus[0]: expected an object"),
        ('{"v":1,"resource":"r","unit":1,"gpus":[{"id":"g"}]}', ".gpus[0].model: expected str"),
        ('{"v":1,"resource":"r","unit":1,"gpus":[{"id":"g","model":"m","milli":2000}]}', "milli"),
        ('{"v":1,"resource":7,"unit":1,"gpus":[]}', ".resource: expected str, got 7"),
    ],
)
def test_a_bad_inventory_is_one_line_naming_the_field(text: str, said: str) -> None:
    with pytest.raises(InventoryError) as caught:
        decode(text)
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


def test_nvlink_groups_join_gpus_linked_through_others() -> None:
    assert nvlink_groups(5, [(0, 1), (1, 2), (3, 3)]) == [0, 0, 0, -1, -1]
    assert nvlink_groups(4, [(2, 3), (0, 3)]) == [0, -1, 0, 0]


def test_a_share_is_of_one_gpu_and_more_is_whole_gpus() -> None:
    assert demand_of(300) == Demand(gpus=1, gpu_milli=300)
    assert demand_of(2000) == Demand(gpus=2, gpu_milli=1000)
    with pytest.raises(ValueError, match="a share is of one GPU"):
        demand_of(1500)


# -- the state -----------------------------------------------------------------------


def test_the_state_takes_the_shares_of_pods_placed_and_of_pods_being_bound() -> None:
    nodes = [node_object("a", inventory("GPU-a0", "GPU-a1")), node_object("b", inventory("GPU-b0"))]
    pods = [
        pod_object("p1", 300, assigned="GPU-a1", node="a"),
        pod_object("p2", 200, assigned="GPU-a1"),  # annotated, its binding under way
        pod_object("p3", 1000, assigned="GPU-b0", node="b", cpu="4"),
        pod_object("done", 500, assigned="GPU-a0", node="a") | {"status": {"phase": "Succeeded"}},
    ]
    cluster = build(nodes, pods)
    assert cluster.nodes["a"].node.gpu_free == [1000, 500]
    assert cluster.nodes["b"].node.gpu_free == [0]
    assert cluster.nodes["b"].node.cpu_free == 28000
    assert cluster.nodes["a"].node.memory_free == 128 * 1024 - 2 * 1024
    assert cluster.owner["GPU-b0"] == "b"


def test_a_node_without_an_inventory_or_with_a_bad_one_is_said_why() -> None:
    plain = {"metadata": {"name": "plain"}, "status": {"allocatable": {"cpu": "1"}}}
    bad = node_object("bad", inventory("GPU-x"))
    bad["metadata"]["annotations"][INVENTORY] = '{"v": 9}'
    cluster = build([plain, bad], [])
    assert cluster.problems == {
        "plain": f"node plain publishes no GPU inventory ({INVENTORY})",
        "bad": f"node bad: {INVENTORY}.v: version 9, this extender reads 1",
    }


def test_a_pod_asks_its_share_in_the_units_of_the_node_and_may_name_models() -> None:
    pod = pod_object("p", 30, models="A100, T4")
    assert pod_demand(pod, inventory("g", unit=10)) == Demand(
        cpu=1000, memory=1024, gpus=1, gpu_milli=300, models=frozenset({"A100", "T4"})
    )


# -- the policies ----------------------------------------------------------------------


class Objects:
    """The API's objects as plain data: what `Extender` reads, for the pure checks of
    the policies' choices (the HTTP tests below use the real API server)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self._nodes, self._pods = nodes, pods
        self.bound: list[tuple[str, str]] = []

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def pods(self) -> list[dict[str, Any]]:
        return self._pods

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return next(p for p in self._pods if p["metadata"]["name"] == name)

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.pod(namespace, name)["metadata"]["annotations"].update(annotations)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.pod(namespace, name)["spec"]["nodeName"] = node
        self.bound.append((name, node))


def two_nodes() -> Objects:
    """Node a: a GPU with 600 free and a whole one, 8 CPUs taken; node b: two whole GPUs."""
    nodes = [
        node_object("a", inventory("GPU-a0", "GPU-a1")),
        node_object("b", inventory("GPU-b0", "GPU-b1")),
    ]
    placed = pod_object("placed", 400, cpu="8", assigned="GPU-a1", node="a")
    return Objects(nodes, [placed, pod_object("new", 400)])


@pytest.mark.parametrize(
    ("policy", "node", "gpu"),
    [
        ("default", "b", "GPU-b0"),
        ("bestfit", "a", "GPU-a1"),
        ("packing", "a", "GPU-a1"),
        ("fgd", "a", "GPU-a1"),
    ],
)
def test_each_policy_binds_the_pod_to_its_node_and_gpu(policy: str, node: str, gpu: str) -> None:
    objects = two_nodes()
    target = TargetWorkload.of(
        [Demand(cpu=1000, gpus=1, gpu_milli=400), Demand(cpu=1000, gpus=1, gpu_milli=1000)]
    )
    extender = Extender(objects, policy, target if policy == "fgd" else None)
    args = {"Pod": objects.pod("", "new"), "Nodes": {"items": objects.nodes()}}
    ranked = {h["Host"]: h["Score"] for h in extender.prioritize(args)}
    assert ranked[node] == 10
    assert max(v for k, v in ranked.items() if k != node) <= 9
    assert extender.bind(
        {"PodName": "new", "PodNamespace": "ns", "PodUID": "uid-new", "Node": node}
    ) == {"Error": ""}
    assert objects.pod("", "new")["metadata"]["annotations"][ASSIGNED] == gpu
    assert objects.bound == [("new", node)]


def test_bind_gives_a_multi_gpu_pod_gpus_of_one_nvlink_group_as_published() -> None:
    """The node publishes two NVLink groups (0-1 and 2-3) and GPU 0 is taken: a pair is
    bound to 2 and 3, not to the first free ones (1 and 2), which span both groups."""
    gpus = tuple(Gpu(f"GPU-n{i}", "A100", nvlink=0 if i < 2 else 2, numa=0) for i in range(4))
    placed = pod_object("placed", 1000, cpu="1", assigned="GPU-n0", node="n")
    objects = Objects(
        [node_object("n", Inventory(RESOURCE, 1, gpus))], [placed, pod_object("pair", 2000)]
    )
    extender = Extender(objects, "bestfit", None)
    assert extender.bind(
        {"PodName": "pair", "PodNamespace": "ns", "PodUID": "uid-pair", "Node": "n"}
    ) == {"Error": ""}
    assert ids(objects.pod("", "pair")["metadata"]["annotations"][ASSIGNED]) == [
        "GPU-n2",
        "GPU-n3",
    ]


def test_rank_gives_the_first_best_ten_and_the_rest_below() -> None:
    assert rank({"x": 1.0, "y": 3.0, "z": 3.0, "w": 2.0}, ["x", "z", "y", "w"]) == {
        "x": 0,
        "z": 10,
        "y": 9,
        "w": 4,
    }
    assert rank({}, []) == {}


def test_an_unhealthy_or_mig_gpu_offers_nothing_and_node_names_are_served_too() -> None:
    sick = Inventory(
        RESOURCE,
        1,
        (
            Gpu("GPU-s0", "A100", healthy=False),
            Gpu("GPU-s1", "A100", mig=("3g.20gb",)),
            Gpu("GPU-s2", "A100"),
        ),
    )
    objects = Objects([node_object("s", sick)], [pod_object("new", 500)])
    assert build(objects.nodes(), []).nodes["s"].node.gpu_free == [0, 0, 1000]
    extender = Extender(objects, "bestfit")
    result = extender.filter({"Pod": objects.pod("", "new"), "NodeNames": ["s", "gone"]})
    assert result["NodeNames"] == ["s"]
    assert result["Nodes"] is None
    assert result["FailedAndUnresolvableNodes"] == {"gone": "node gone is not known"}
    assert extender.bind(
        {"PodName": "new", "PodNamespace": "ns", "PodUID": "uid-new", "Node": "s"}
    ) == {"Error": ""}
    assert objects.pod("", "new")["metadata"]["annotations"][ASSIGNED] == "GPU-s2"


# -- the config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvidia", "said"),
    [
        (
            {"replicas": 3},
            "resources[0].nvidia.replicas: replicaPolicy extender: expected a divisor of 1000 "
            "from 2 to 1000 (each replica is 1000 / replicas milli-GPUs), got 3",
        ),
        ({"replicas": 1}, "resources[0].nvidia.replicas: replicaPolicy extender"),
        ({"replicas": 10, "sharing": "mps"}, "replicaPolicy extender shares GPUs by time-slicing"),
    ],
)
def test_shares_for_the_extender_are_divisors_of_a_gpu_said_in_one_line(
    nvidia: dict[str, Any], said: str
) -> None:
    from devplug.sources import ConfigError, parse_config

    text = yaml.safe_dump({"resources": [{"nvidia": {"replicaPolicy": "extender", **nvidia}}]})
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)
    good = {"resources": [{"nvidia": {"replicaPolicy": "extender", "replicas": 1000}}]}
    assert parse_config(yaml.safe_dump(good), "c.yaml").resources[0].nvidia is not None
