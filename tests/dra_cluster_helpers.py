"""Helpers for DRA against a real control plane (tests/controlplane/dra): the bodies of
classes, claims and pods, a node serving a config (the simulator's kubelet following
the API server, the real daemon), and waits on the API server's watches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from devplug.apiserver.client import KubeApi
from devplug.framework.dra.claims import ApiClaims
from devplug.simulator import Kubelet, PodResult
from devplug.simulator.apipods import ApiPodFollower
from devplug.simulator.dra import NodeSlices
from devplug.testing.controlplane import watch_until
from tests.dra_helpers import DRIVER, NODE, Daemon, NodeDirs, serve_command

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30


def driver_class(name: str) -> dict[str, Any]:
    """A DeviceClass `name` of every device of DRIVER."""
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return {"metadata": {"name": name}, "spec": {"selectors": [selector]}}


@contextlib.contextmanager
def device_class_made(api: Any, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The DeviceClass `body` on the API server while the block runs (other tests make
    classes of the same name)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    resource.create_device_class(body)
    try:
        yield body
    finally:
        resource.delete_device_class(body["metadata"]["name"])


def resources(api: Any) -> Any:
    """The resource.k8s.io/v1 API of the official client on `api`."""
    from kubernetes import client

    return client.ResourceV1Api(api)


@contextlib.contextmanager
def fresh_namespace(api: Any) -> Iterator[str]:
    """A fresh namespace; afterwards its pods and claims are gone and their devices
    free again (this control plane has no controller that releases claims)."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    for pod in core.list_namespaced_pod(name).items:
        core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
    for claim in resource.list_namespaced_resource_claim(name).items:
        claim_name = claim.metadata.name
        resource.patch_namespaced_resource_claim_status(
            claim_name, name, {"status": {"reservedFor": None, "allocation": None, "devices": None}}
        )
        resource.patch_namespaced_resource_claim(
            claim_name, name, {"metadata": {"finalizers": None}}
        )
        resource.delete_namespaced_resource_claim(claim_name, name)


def slice_devices(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in obj["spec"].get("devices") or []}


def our_slice(predicate: Callable[[dict[str, dict[str, Any]]], bool]) -> Callable[..., bool]:
    """A slice of DRIVER whose devices (by name) `predicate` accepts."""

    def match(obj: dict[str, Any]) -> bool:
        return obj["spec"]["driver"] == DRIVER and predicate(slice_devices(obj))

    return match


async def slice_where(api: Any, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first ResourceSlice `predicate` accepts, from the API server's watch."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    return await asyncio.to_thread(watch_until, api, resource.list_resource_slice, predicate)


async def claim_where(
    api: Any, namespace: str, name: str, test: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The claim `name` once `test` accepts it, from the API server's watch."""
    from kubernetes import client

    return await asyncio.to_thread(
        watch_until,
        api,
        client.ResourceV1Api(api).list_namespaced_resource_claim,
        lambda o: o["metadata"]["name"] == name and test(o),
        namespace=namespace,
    )


async def published_by(
    api: Any, driver: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """A slice of `driver` whose spec `predicate` accepts, once published."""
    return await slice_where(api, lambda o: o["spec"]["driver"] == driver and predicate(o["spec"]))


def claim_body(name: str, model: str, device_class: str = DRIVER) -> dict[str, Any]:
    expression = f'device.attributes["{DRIVER}"].model == "{model}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "acc",
                        "exactly": {
                            "deviceClassName": device_class,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def pod_body(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "acc", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": "acc"}]},
                }
            ],
        },
    }


def node_kubelet(dirs: NodeDirs, kube: KubeApi, slices: NodeSlices | None = None) -> Kubelet:
    """The simulator's kubelet for NODE, its claims read from the API server through
    `kube` (entered by the caller)."""
    return Kubelet(
        dirs.plugin_dir,
        dirs.state_dir,
        control_socket=False,
        dra_registry_dir=dirs.registry,
        claims=ApiClaims(kube),
        node_slices=slices,
    )


@contextlib.asynccontextmanager
async def following(kubelet: Kubelet, kube: KubeApi) -> AsyncIterator[None]:
    """The kubelet runs the pods bound to NODE on the API server while the block runs."""
    follower = asyncio.create_task(ApiPodFollower(kubelet, kube, NODE).run())
    try:
        yield
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await follower


@contextlib.asynccontextmanager
async def node_serving(
    dirs: NodeDirs,
    api: Any,
    kubeconfig: str,
    config: Path,
    driver: str,
    env: dict[str, str] | None = None,
    *extra: str,
    daemon_kubeconfig: str | None = None,
) -> AsyncIterator[Kubelet]:
    """The simulator's kubelet for NODE, following the pods bound to it on the API server,
    and the real daemon serving `config` with its DRA `driver` registered (through
    `daemon_kubeconfig` where given, else the kubelet's `kubeconfig`: the cluster's admin,
    as a kubelet reads every claim of its node and wipes its slices)."""
    async with (
        KubeApi.from_kubeconfig(kubeconfig) as kube,
        node_kubelet(dirs, kube, NodeSlices(kube, NODE)) as kubelet,
    ):
        daemon = Daemon(
            serve_command(dirs, config, *extra, kubeconfig=daemon_kubeconfig or kubeconfig),
            dirs.root / "daemon.log",
            env,
        )
        try:
            async with following(kubelet, kube):
                await kubelet.wait_for_registration(driver, timeout=WAIT_S)
                yield kubelet
        finally:
            daemon.stop()


async def admitted(kubelet: Kubelet, name: str, namespace: str) -> PodResult:
    def done() -> bool:
        pod = kubelet.pod(name, namespace)
        return pod is not None and pod.admitted

    await kubelet.wait_for(done, timeout=WAIT_S, what=f"{name} admitted")
    pod = kubelet.pod(name, namespace)
    assert pod is not None
    return pod


async def gone(kubelet: Kubelet, name: str, namespace: str) -> None:
    """Once the kubelet no longer runs the pod (deleted from the API server)."""
    await kubelet.wait_for(
        lambda: kubelet.pod(name, namespace) is None, timeout=WAIT_S, what=f"{name} deleted"
    )


def unschedulable(api: Any, name: str, namespace: str) -> dict[str, Any]:
    """The pod once the scheduler gave up on it; blocking."""
    from kubernetes import client

    return watch_until(
        api,
        client.CoreV1Api(api).list_namespaced_pod,
        lambda p: (
            p["metadata"]["name"] == name
            and any(
                c.get("reason") == "Unschedulable"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ),
        namespace=namespace,
    )


async def pending(api: Any, name: str, namespace: str) -> dict[str, Any]:
    """The pod once the scheduler gave up on it."""
    return await asyncio.to_thread(unschedulable, api, name, namespace)


def scheduled_message(pod: dict[str, Any]) -> str:
    """The scheduler's reason on the pod's PodScheduled condition."""
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return str(condition["message"])


# -- the examples of docs/dra.md --------------------------------------------------------


def doc_objects(*names: str) -> list[dict[str, Any]]:
    """The objects of docs/dra.md with these names, in that order."""
    from tests.unit.test_dra_docs import manifests

    found = {m["metadata"]["name"]: m for m in manifests()}
    return [found[n] for n in names]


def doc_config(marker: str) -> dict[str, Any]:
    import yaml

    from tests.unit.test_dra_docs import blocks

    [block] = [b for b in blocks("yaml") if b.startswith("resources:") and marker in b]
    config: dict[str, Any] = yaml.safe_load(block)
    return config


def claim_from(template: dict[str, Any], name: str) -> dict[str, Any]:
    """A claim made from a template, as the resourceclaim controller (absent from this
    control plane) would."""
    return {"metadata": {"name": name}, "spec": template["spec"]["spec"]}


def pod_from(pod: dict[str, Any], name: str, claim: str) -> dict[str, Any]:
    """The doc's pod under `name`, using the claim `claim` made from its template."""
    body = json.loads(json.dumps(pod))
    body["metadata"]["name"] = name
    [entry] = body["spec"]["resourceClaims"]
    del entry["resourceClaimTemplateName"]
    entry["resourceClaimName"] = claim
    return body


def allocation(resource: Any, name: str, namespace: str) -> list[dict[str, Any]]:
    response = resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
    status = json.loads(response.data).get("status") or {}
    results: list[dict[str, Any]] = ((status.get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return results


def variant(template: dict[str, Any], expression: str) -> dict[str, Any]:
    """A copy of a claim template whose request selects by `expression` instead."""
    copy: dict[str, Any] = json.loads(json.dumps(template))
    [request] = copy["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["selectors"][0]["cel"]["expression"] = expression
    return copy


def release(resource: Any, name: str, namespace: str) -> None:
    """Deallocate a claim whose pod is gone (the controller-manager's work)."""
    resource.patch_namespaced_resource_claim_status(
        name, namespace, {"status": {"reservedFor": None, "allocation": None}}
    )
