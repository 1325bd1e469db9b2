"""`devplug extender`'s verbs over real HTTP against a real API server (the throwaway
control plane): filter, prioritize and bind in the scheduler's JSON shapes, the pod
bound and its GPU recorded, and a second extender (a restart) that reads the same
state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devplug.extender.server import ExtenderServer
from devplug.extender.verbs import Extender
from devplug.placement.inventory import ASSIGNED
from tests.process.test_extender_http import post
from tests.unit.test_extender_state import RESOURCE, inventory, node_object, pod_object


@pytest.fixture
def served(kubeconfig: str) -> Iterator[ExtenderServer]:
    from devplug.extender.kubeapi import KubeApi

    api = KubeApi(kubeconfig)
    server = ExtenderServer(("127.0.0.1", 0), Extender(api, "bestfit"))
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        api.close()


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
    restarted = KubeApi(kubeconfig)
    try:
        cluster, _ = Extender(restarted, "bestfit").state()
    finally:
        restarted.close()
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
