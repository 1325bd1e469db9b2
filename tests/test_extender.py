"""`devplug extender`: the GPU inventory a node publishes, the cluster state rebuilt from
Nodes and pods, each policy's choice, and the verbs over real HTTP against a real API
server (the throwaway control plane): filter, prioritize and bind in the scheduler's
JSON shapes, bad input answered in one line, a restarted extender that forgets nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.extender.server import ExtenderServer
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


def test_rank_gives_the_first_best_ten_and_the_rest_below() -> None:
    assert rank({"x": 1.0, "y": 3.0, "z": 3.0, "w": 2.0}, ["x", "z", "y", "w"]) == {
        "x": 0,
        "z": 10,
        "y": 9,
        "w": 4,
    }
    assert rank({}, []) == {}


# -- over HTTP, on a real API server -----------------------------------------------------


@pytest.fixture
def api(kubeconfig: str) -> Iterator[Any]:
    from devplug.framework.dra.kube import api_client

    client = api_client(kubeconfig)
    try:
        yield client
    finally:
        client.close()


def post(url: str, verb: str, body: bytes | Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/{verb}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served(kubeconfig: str) -> Iterator[ExtenderServer]:
    from devplug.extender.kubeapi import KubeApi

    server = ExtenderServer(("127.0.0.1", 0), Extender(KubeApi(kubeconfig), "bestfit"))
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_verbs_over_http_place_bind_and_survive_a_restart(
    kubeconfig: str, api: Any, served: ExtenderServer
) -> None:
    from kubernetes import client

    from devplug.extender.kubeapi import KubeApi

    core = client.CoreV1Api(api)
    tag = uuid.uuid4().hex[:6]
    names = [f"ext-{tag}-a", f"ext-{tag}-b"]
    namespace = f"ext-{tag}"
    core.create_namespace({"metadata": {"name": namespace}})
    for name in names:
        obj = node_object(name, inventory(f"GPU-{name}-0", f"GPU-{name}-1"))
        status = obj.pop("status")
        core.create_node(obj)
        core.patch_node_status(name, {"status": status | {"capacity": status["allocatable"]}})
    first = pod_object("first", 700)
    core.create_namespaced_pod(namespace, first)

    def args(pod: str) -> dict[str, Any]:
        pod_obj = json.loads(core.read_namespaced_pod(pod, namespace, _preload_content=False).data)
        nodes = [json.loads(core.read_node(n, _preload_content=False).data) for n in names]
        return {"Pod": pod_obj, "Nodes": {"items": nodes}, "NodeNames": None}

    status, filtered = post(served.url, "filter", args("first"))
    assert status == 200
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == names
    assert filtered["FailedNodes"] == {}
    assert filtered["Error"] == ""
    status, scores = post(served.url, "prioritize", args("first"))
    assert scores == [{"Host": names[0], "Score": 10}, {"Host": names[1], "Score": 9}]
    uid = json.loads(core.read_namespaced_pod("first", namespace, _preload_content=False).data)[
        "metadata"
    ]["uid"]
    binding = {"PodName": "first", "PodNamespace": namespace, "PodUID": uid, "Node": names[0]}
    assert post(served.url, "bind", binding) == (200, {"Error": ""})
    bound = core.read_namespaced_pod("first", namespace)
    assert bound.spec.node_name == names[0]
    assert bound.metadata.annotations[ASSIGNED] == f"GPU-{names[0]}-0"

    # A second extender (a restart) reads the same state: 700 of GPU 0 taken.
    second = pod_object("second", 400)
    core.create_namespaced_pod(namespace, second)
    again = Extender(KubeApi(kubeconfig), "bestfit")
    cluster, _ = again.state()
    assert cluster.nodes[names[0]].node.gpu_free == [300, 1000]
    status, filtered = post(served.url, "filter", args("second"))
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == names
    too_big = pod_object("big", 2000)
    too_big["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = "1500"
    core.create_namespaced_pod(namespace, too_big)
    status, filtered = post(served.url, "filter", args("big"))
    assert filtered["Nodes"]["items"] == []
    assert set(filtered["FailedAndUnresolvableNodes"]) == set(names)
    assert "a share is of one GPU" in filtered["FailedAndUnresolvableNodes"][names[0]]

    stale = dict(binding, PodUID="not-the-uid", PodName="second")
    status, answer = post(served.url, "bind", stale)
    assert status == 200
    assert answer["Error"].startswith(f"pod {namespace}/second has UID")


@pytest.mark.parametrize(
    ("verb", "body", "said"),
    [
        ("filter", b"{not json", "/filter: the body is not JSON"),
        ("filter", [], "/filter: the request: expected an object, got list"),
        ("filter", {"Pod": 3}, "/filter: Pod: expected an object, got int"),
        ("prioritize", {"Pod": {}}, "/prioritize: the request has neither Nodes nor NodeNames"),
        ("bind", {"PodName": "x"}, "/bind: PodNamespace: expected a non-empty string, got None"),
        ("nothing", {}, "no such verb '/nothing'"),
    ],
)
def test_bad_requests_get_400_and_one_line(
    served: ExtenderServer, verb: str, body: Any, said: str
) -> None:
    status, text = post(served.url, verb, body)
    assert status == (404 if verb == "nothing" else 400)
    assert text.startswith(said), text
    assert text.count("\n") == 1
    assert "Traceback" not in text


def test_the_command_refuses_a_bad_listen_address_and_an_unknown_policy_in_one_line() -> None:
    for args, said in (
        (["--port", "70000"], "expected a TCP port, 0 to 65535"),
        (["--policy", "random"], "invalid choice: 'random'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "devplug.cli.main", "extender", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert said in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


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


def test_an_api_server_away_is_503_for_filter_and_an_error_for_bind_in_one_line(
    short_tmp: Path,
) -> None:
    from api_servers import closed_port, write_kubeconfig

    from devplug.extender.kubeapi import KubeApi

    kubeconfig = write_kubeconfig(short_tmp / "kc", f"https://127.0.0.1:{closed_port()}")
    server = ExtenderServer(("127.0.0.1", 0), Extender(KubeApi(str(kubeconfig)), "fgd"))
    server.start()
    try:
        status, text = post(server.url, "filter", {"Pod": {}, "NodeNames": ["a"]})
        assert status == 503
        assert text == "/filter: the API server cannot be reached (connection refused)\n"
        bind = {"PodName": "p", "PodNamespace": "n", "PodUID": "u", "Node": "a"}
        assert post(server.url, "bind", bind) == (
            200,
            {"Error": "the API server cannot be reached (connection refused)"},
        )
    finally:
        server.shutdown()
        server.server_close()
