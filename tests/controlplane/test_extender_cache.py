"""The extender's cache against a real API server (the throwaway control plane): Nodes
and pods followed by list and watch, so a change reaches the verbs without a list; a
watch the server ends resumed from its version, and one refused as too old (410)
listed again, losing nothing; binds assumed at once, so two in a row take different shares while
the watch is behind; a new cache (a restart) rebuilding the same state; and /readyz
saying ready only once the cache has listed."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest

from devplug.apiserver import client
from devplug.apiserver.kubeconfig import load
from devplug.extender.cache import Cache
from devplug.extender.kubeapi import KubeApi
from devplug.extender.server import ExtenderServer
from devplug.extender.verbs import Extender
from devplug.placement.inventory import ASSIGNED
from tests.unit.test_extender_state import inventory, node_object, pod_object

WAIT_S = 30.0


@pytest.fixture
def kube(kubeconfig: str) -> Iterator[KubeApi]:
    api = KubeApi(kubeconfig)
    try:
        yield api
    finally:
        api.close()


class Cluster:
    """A namespace and GPU nodes of this test in the shared API server."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client

        from devplug.testing.official import api_client

        self.client = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.client)
        self.tag = uuid.uuid4().hex[:6]
        self.namespace = f"cache-{self.tag}"
        self.core.create_namespace({"metadata": {"name": self.namespace}})

    def node(self, name: str, *gpus: str) -> str:
        name = f"{name}-{self.tag}"
        obj = node_object(name, inventory(*(f"GPU-{name}-{g}" for g in gpus)))
        status = obj.pop("status")
        self.core.create_node(obj)
        self.core.patch_node_status(name, {"status": status | {"capacity": status["allocatable"]}})
        return name

    def pod(self, name: str, milli: int, **kwargs: Any) -> dict[str, Any]:
        answer = self.core.create_namespaced_pod(
            self.namespace, pod_object(name, milli, **kwargs), _preload_content=False
        )
        pod: dict[str, Any] = json.loads(answer.data)
        return pod

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def cluster(kubeconfig: str) -> Iterator[Cluster]:
    made = Cluster(kubeconfig)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def caches() -> Iterator[list[Cache]]:
    started: list[Cache] = []
    try:
        yield started
    finally:
        for cache in started:
            cache.stop()


def free(cache: Cache, node: str) -> list[int] | None:
    view = cache.node_view(node)
    return None if view is None else list(view.node.gpu_free)


def until(cache: Cache, node: str, wanted: list[int]) -> None:
    assert cache.wait_for(lambda: free(cache, node) == wanted, WAIT_S), free(cache, node)


PODS = "/api/v1/pods"


class Hooks(client.KubeApi):
    """The real client with a step run before each pods watch is opened (a change made
    while no watch is open), which may refuse the watch as the API server refuses one
    whose version its history no longer holds (a 410 Status event: the server's watch
    cache here holds its whole history, so it never does by itself); and one before
    each pods event passed on."""

    watches = 0

    async def before(self, watch: int) -> bool:
        return True

    async def each(self) -> None:
        pass

    async def watch(
        self, path: str, params: Mapping[str, str], timeout: float
    ) -> AsyncIterator[bytes]:
        hooked = path == PODS
        if hooked:
            self.watches += 1
            if not await self.before(self.watches):
                gone = {"kind": "Status", "code": 410, "reason": "Expired"}
                message = f"too old resource version: {params['resourceVersion']}"
                yield json.dumps({"type": "ERROR", "object": gone | {"message": message}}).encode()
                return
        async for line in super().watch(path, params, timeout):
            if hooked:
                await self.each()
            yield line


@pytest.fixture
def hooked(kubeconfig: str) -> Iterator[Callable[[type[Hooks]], KubeApi]]:
    """The extender's API over a client with hooks."""
    made: list[KubeApi] = []

    def make(hooks: type[Hooks]) -> KubeApi:
        made.append(KubeApi(client=hooks(load(kubeconfig))))
        return made[-1]

    try:
        yield make
    finally:
        for api in made:
            api.close()


def test_a_node_or_pod_change_reaches_the_verbs_by_the_watch_without_a_list(
    kube: KubeApi, cluster: Cluster, caches: list[Cache]
) -> None:
    node = cluster.node("watched", "0", "1")
    cache = Cache(kube)
    caches.append(cache)
    cache.start()
    assert cache.wait_synced(WAIT_S)
    until(cache, node, [1000, 1000])
    extender = Extender(kube, "bestfit", cache=cache)

    cluster.pod("placed", 700, node=node, assigned=f"GPU-{node}-0")
    until(cache, node, [300, 1000])
    asked = {"Pod": pod_object("next", 400), "NodeNames": [node]}
    assert extender.filter(asked)["NodeNames"] == [node]
    cluster.core.delete_namespaced_pod("placed", cluster.namespace, grace_period_seconds=0)
    until(cache, node, [1000, 1000])

    # The node publishes one GPU less: the verbs see it.
    notes = node_object(node, inventory(f"GPU-{node}-0"))["metadata"]["annotations"]
    cluster.core.patch_node(node, {"metadata": {"annotations": notes}})
    until(cache, node, [1000])
    big = {"Pod": pod_object("big", 1000, cpu="1"), "NodeNames": [node]}
    big["Pod"]["spec"]["containers"][0]["resources"]["limits"]["devplug.io/gpu-milli"] = "2000"
    assert extender.filter(big)["NodeNames"] == []
    assert [i.lists for i in cache.informers.values()] == [1, 1]


def test_a_watch_that_ends_is_resumed_and_one_too_old_lists_again_losing_nothing(
    hooked: Callable[[type[Hooks]], KubeApi], cluster: Cluster, caches: list[Cache]
) -> None:
    node = cluster.node("resumed", "0", "1")

    class Resumed(Hooks):
        async def before(self, watch: int) -> bool:
            """Each pods watch after the first: a pod bound while no watch is open; the
            third refused as too old."""
            if watch == 2:
                await asyncio.to_thread(
                    cluster.pod, "gap", 300, node=node, assigned=f"GPU-{node}-0"
                )
            if watch == 3:
                await asyncio.to_thread(
                    cluster.pod, "gone", 500, node=node, assigned=f"GPU-{node}-1"
                )
                return False
            return True

    cache = Cache(hooked(Resumed), watch_timeout_s=1)  # the server ends each watch after 1 s
    caches.append(cache)
    pods = cache.informers["pods"]
    cache.start()
    # The first watch ended, the second resumed from its version: the pod made between
    # them is seen without a list.
    until(cache, node, [700, 1000])
    assert pods.lists == 1
    # The third was refused as too old: listed again, the pod made before it is seen.
    until(cache, node, [700, 500])
    assert pods.lists == 2


def test_two_binds_in_a_row_take_different_shares_while_the_watch_is_behind(
    kube: KubeApi,
    hooked: Callable[[type[Hooks]], KubeApi],
    cluster: Cluster,
    caches: list[Cache],
) -> None:
    node = cluster.node("bound", "0", "1")
    held = threading.Event()
    released = threading.Event()

    class Held(Hooks):
        async def each(self) -> None:
            """The pods watch's events held back while `held` is set."""
            if held.is_set():
                await asyncio.to_thread(released.wait, WAIT_S)

    cache = Cache(hooked(Held))
    caches.append(cache)
    cache.start()
    assert cache.wait_synced(WAIT_S)
    until(cache, node, [1000, 1000])
    extender = Extender(kube, "bestfit", cache=cache)
    made = [cluster.pod(name, 600) for name in ("first", "second")]
    assert cache.wait_for(lambda: cache.pod(cluster.namespace, "second") is not None, WAIT_S)
    held.set()
    for pod in made:
        meta = pod["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": cluster.namespace}
        answer = extender.bind(binding | {"PodUID": meta["uid"], "Node": node})
        assert answer == {"Error": ""}
    given = [
        cluster.core.read_namespaced_pod(name, cluster.namespace).metadata.annotations[ASSIGNED]
        for name in ("first", "second")
    ]
    assert sorted(given) == [f"GPU-{node}-0", f"GPU-{node}-1"]
    assert cache.assumed == 2
    released.set()
    assert cache.wait_for(lambda: cache.assumed == 0, WAIT_S)  # the watch confirmed both
    until(cache, node, [400, 400])

    # A restart: a new cache lists the same state from the API server.
    again = Cache(kube)
    caches.append(again)
    again.start()
    assert again.wait_synced(WAIT_S)
    assert free(again, node) == [400, 400]


def readyz(server: ExtenderServer) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.url}/readyz", timeout=WAIT_S) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()


def test_the_extender_is_ready_only_once_its_cache_has_listed_the_cluster(
    kube: KubeApi, caches: list[Cache]
) -> None:
    from tests.process.test_extender_http import post

    cache = Cache(kube)
    caches.append(cache)
    server = ExtenderServer(("127.0.0.1", 0), Extender(kube, "bestfit", cache=cache))
    server.start()
    try:
        assert readyz(server) == (503, "not ready: the cluster's Nodes and pods are not listed yet")
        status, said = post(server.url, "filter", {"Pod": pod_object("p", 100), "NodeNames": []})
        assert status == 503
        assert "has not listed" in said
        cache.start()
        assert cache.wait_synced(WAIT_S)
        assert readyz(server) == (200, "ok")
    finally:
        server.shutdown()
        server.server_close()
