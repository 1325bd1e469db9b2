"""DRA against a real control plane (etcd + kube-apiserver + kube-scheduler): the real
daemon publishes slices, the real scheduler allocates claims and binds pods, the
simulator's kubelet prepares them through the real node plugin.

Skipped, saying how to provide them, where the control-plane binaries are absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.framework.dra.claims import ApiClaims
from devplug.framework.dra.kube import api_client
from devplug.simulator import Kubelet, PodResult
from devplug.simulator.apipods import ApiPodFollower
from devplug.testing.controlplane import watch_until
from devplug.testing.fakenvml import FakeGpuHost, gpu, gpu_uuid
from tests.dra_helpers import (
    DRIVER,
    NODE,
    RESOURCE,
    Daemon,
    NodeDirs,
    accelerator_config,
    first_result,
    kubelet_process,
    serve_command,
)

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30


@pytest.fixture(scope="session")
def api(kubeconfig: str) -> Iterator[Any]:
    client = api_client(kubeconfig)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def node(api: Any) -> str:
    from kubernetes import client

    core = client.CoreV1Api(api)
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    core.patch_node_status(NODE, {"status": {"capacity": capacity, "allocatable": capacity}})
    core.patch_node(NODE, {"spec": {"taints": None}})
    return NODE


def slice_devices(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in obj["spec"].get("devices") or []}


def our_slice(predicate: Callable[[dict[str, dict[str, Any]]], bool]) -> Callable[..., bool]:
    def match(obj: dict[str, Any]) -> bool:
        return obj["spec"]["driver"] == DRIVER and predicate(slice_devices(obj))

    return match


@pytest.fixture
def namespace(api: Any) -> str:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def claim_body(name: str, model: str) -> dict[str, Any]:
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
                            "deviceClassName": DRIVER,
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


@contextlib.asynccontextmanager
async def node_serving(
    dirs: NodeDirs,
    api: Any,
    kubeconfig: str,
    config: Path,
    driver: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Kubelet]:
    """The simulator's kubelet for NODE, following the pods bound to it on the API server,
    and the real daemon serving `config` with its DRA `driver` registered."""
    async with Kubelet(
        dirs.plugin_dir,
        dirs.state_dir,
        control_socket=False,
        dra_registry_dir=dirs.registry,
        claims=ApiClaims(api),
    ) as kubelet:
        daemon = Daemon(
            serve_command(dirs, config, kubeconfig=kubeconfig), dirs.root / "daemon.log", env
        )
        follower = asyncio.create_task(ApiPodFollower(kubelet, api, NODE).run())
        try:
            await kubelet.wait_for_registration(driver, timeout=WAIT_S)
            yield kubelet
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await follower
            daemon.stop()


async def admitted(kubelet: Kubelet, name: str, namespace: str) -> PodResult:
    def done() -> bool:
        pod = kubelet.pod(name, namespace)
        return pod is not None and pod.admitted

    await kubelet.wait_for(done, timeout=WAIT_S, what=f"{name} admitted")
    pod = kubelet.pod(name, namespace)
    assert pod is not None
    return pod


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


def scheduled_message(pod: dict[str, Any]) -> str:
    """The scheduler's reason on the pod's PodScheduled condition."""
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return str(condition["message"])


def test_scheduler_allocates_and_the_node_plugin_prepares(
    kubeconfig: str, api: Any, node: str, namespace: str, short_tmp: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    resource = client.ResourceV1Api(api)
    dirs = NodeDirs(short_tmp)
    dirs.make_device("acc0")
    config = accelerator_config(
        dirs, {"acc0": "u250", "acc1": "u280"}, mode="both", preferredAllocation=False
    )
    # A glob group for hot-plug: nothing matches yet.
    text = config.read_text().replace(
        "  groups:\n", f"  groups:\n  - paths:\n    - path: {dirs.dev}/hot*\n", 1
    )
    config.write_text(text)

    async def scenario() -> None:
        async with node_serving(dirs, api, kubeconfig, config, DRIVER) as kubelet:
            await kubelet.wait_for_resource(RESOURCE, count=2, timeout=WAIT_S)
            published = await asyncio.to_thread(
                watch_until,
                api,
                resource.list_resource_slice,
                our_slice(lambda d: {"acc0", "acc1"} <= set(d)),
            )
            spec = published["spec"]
            assert (spec["nodeName"], spec["pool"]["name"]) == (NODE, NODE)
            assert spec["pool"]["resourceSliceCount"] == 1
            acc1 = slice_devices(published)["acc1"]
            assert acc1["attributes"]["model"] == {"string": "u280"}
            assert acc1["attributes"]["vendor"] == {"string": "xilinx"}
            assert acc1["capacity"]["memory"]["value"] == str(8 << 30)
            owner = published["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"]) == ("Node", NODE)

            resource.create_device_class(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": DRIVER},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                }
            )
            claim = resource.create_namespaced_resource_claim(
                namespace, claim_body("claim-u280", "u280")
            )
            core.create_namespaced_pod(namespace, pod_body("pod-u280", "claim-u280"))

            pod = await admitted(kubelet, "pod-u280", namespace)
            cdi = f"{DRIVER}/claim={claim.metadata.uid}-acc1"
            assert pod.containers[0].options.cdi_devices == [cdi]
            allocated = resource.read_namespaced_resource_claim("claim-u280", namespace)
            [result] = allocated.status.allocation.devices.results
            assert (result.driver, result.pool, result.device) == (DRIVER, NODE, "acc1")
            spec_file = dirs.cdi / f"{DRIVER}-{claim.metadata.uid}.json"
            assert spec_file.exists()

            # The pod deleted from the API server: the node unprepares its claim.
            core.delete_namespaced_pod("pod-u280", namespace, grace_period_seconds=0)
            await kubelet.wait_for(
                lambda: kubelet.pod("pod-u280", namespace) is None,
                timeout=WAIT_S,
                what="pod-u280 deleted",
            )
            assert not spec_file.exists()

            # A claim no device meets: Pending, with the scheduler's reason.
            resource.create_namespaced_resource_claim(namespace, claim_body("claim-u999", "u999"))
            core.create_namespaced_pod(namespace, pod_body("pod-u999", "claim-u999"))
            pending = await asyncio.to_thread(unschedulable, api, "pod-u999", namespace)
            assert pending["status"]["phase"] == "Pending"
            assert "cannot allocate all claims" in scheduled_message(pending)

            # Hot-plug: a new device node joins the slice; a removed one turns Unhealthy
            # and leaves it.
            dirs.make_device("hot0")
            grown = await asyncio.to_thread(
                watch_until,
                api,
                resource.list_resource_slice,
                our_slice(lambda d: any("-hot0" in n for n in d)),
            )
            # A new pool generation, so the scheduler drops what it knew of the old one.
            assert grown["spec"]["pool"]["generation"] > spec["pool"]["generation"]
            (dirs.dev / "acc0").unlink()
            await asyncio.to_thread(
                watch_until,
                api,
                resource.list_resource_slice,
                our_slice(lambda d: "acc0" not in d and "acc1" in d and len(d) == 2),
            )

    asyncio.run(scenario())


def test_cel_capacity_selector_picks_the_gpu_with_enough_memory(
    kubeconfig: str, api: Any, node: str, namespace: str, short_tmp: Path
) -> None:
    """The deploy DeviceClass 'a GPU with at least 40 GiB' (a CEL compareTo on the
    memory capacity), allocated by the real scheduler among the GPUs the daemon
    publishes from (fake) NVML: the 40 GiB one, never the 24 GiB one."""
    import yaml
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    gpu_driver = "gpu.devplug.io"
    classes = (ROOT / "deploy" / "dra" / "component" / "deviceclasses.yaml").read_text()
    [big] = [
        c for c in yaml.safe_load_all(classes) if c["metadata"]["name"] == "gpu-40gib.devplug.io"
    ]
    resource.create_device_class(big)
    small = gpu(0, name="NVIDIA A10", memory_gib=24, cc=(8, 6), numa=0)
    large = gpu(1, name="NVIDIA A100-SXM4-40GB", memory_gib=40, cc=(8, 0), numa=0)
    description = {"driver": {"loaded": True}, "gpus": [small, large], "topology": [], "xids": []}
    dirs = NodeDirs(short_tmp)
    host = FakeGpuHost(dirs.root / "gpus", description)
    config = dirs.root / "gpus.yaml"
    entry = {"nvidia": {"hostRoot": host.host_root}, "mode": "dra", "dra": {"driver": gpu_driver}}
    config.write_text(yaml.safe_dump({"resources": [entry]}))

    def gpu_claim(name: str) -> dict[str, Any]:
        request = {"name": "gpu", "exactly": {"deviceClassName": big["metadata"]["name"]}}
        return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}

    def gpu_pod(name: str, claim: str) -> dict[str, Any]:
        body = pod_body(name, claim)
        body["spec"]["resourceClaims"][0]["name"] = "acc"
        return body

    async def scenario() -> None:
        async with node_serving(dirs, api, kubeconfig, config, gpu_driver, host.env) as kubelet:
            published = await asyncio.to_thread(
                watch_until,
                api,
                resource.list_resource_slice,
                lambda o: o["spec"]["driver"] == gpu_driver and len(slice_devices(o)) == 2,
            )
            memory = {
                d["attributes"]["uuid"]["string"]: d["capacity"]["memory"]["value"]
                for d in slice_devices(published).values()
            }
            assert memory == {gpu_uuid(0): str(24 << 30), gpu_uuid(1): str(40 << 30)}

            claim = resource.create_namespaced_resource_claim(namespace, gpu_claim("big-gpu"))
            core.create_namespaced_pod(namespace, gpu_pod("pod-big-gpu", "big-gpu"))
            pod = await admitted(kubelet, "pod-big-gpu", namespace)
            allocated = resource.read_namespaced_resource_claim("big-gpu", namespace)
            [result] = allocated.status.allocation.devices.results
            chosen = slice_devices(published)[result.device]
            assert chosen["attributes"]["uuid"] == {"string": gpu_uuid(1)}
            uid = claim.metadata.uid
            assert pod.containers[0].options.cdi_devices == [
                f"{gpu_driver}/claim={uid}-{result.device}"
            ]
            spec = json.loads((dirs.cdi / f"{gpu_driver}-{uid}.json").read_text())
            [device] = spec["devices"]
            nodes = {n["path"] for n in device["containerEdits"]["deviceNodes"]}
            assert "/dev/nvidia1" in nodes
            assert "/dev/nvidia0" not in nodes
            assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(1)}" in spec["containerEdits"]["env"]

            # The 40 GiB GPU is taken; the 24 GiB one is free but does not qualify.
            resource.create_namespaced_resource_claim(namespace, gpu_claim("second-gpu"))
            core.create_namespaced_pod(namespace, gpu_pod("pod-second-gpu", "second-gpu"))
            pending = await asyncio.to_thread(unschedulable, api, "pod-second-gpu", namespace)
            assert pending["status"]["phase"] == "Pending"
            assert "cannot allocate all claims" in scheduled_message(pending)

    try:
        asyncio.run(scenario())
    finally:  # the deploy test creates the same class
        resource.delete_device_class(big["metadata"]["name"])


def test_deploy_rbac_and_device_classes_on_the_api_server(api: Any) -> None:
    """The component's RBAC grants the service account what the driver does and no
    more; its DeviceClasses (CEL included) are accepted by the API server."""
    import yaml
    from kubernetes import client, utils

    component = ROOT / "deploy" / "dra" / "component"
    for name, dry_run in (("rbac.yaml", None), ("deviceclasses.yaml", "All")):
        objects = list(yaml.safe_load_all((component / name).read_text()))
        utils.create_from_yaml(api, yaml_objects=objects, dry_run=dry_run)
    authz = client.AuthorizationV1Api(api)
    user = "system:serviceaccount:devplug-system:devplug"

    def allowed(group: str, resource: str, verb: str) -> bool:
        review = authz.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "resourceAttributes": {"group": group, "resource": resource, "verb": verb},
                },
            }
        )
        return bool(review.status.allowed)

    for verb in ("list", "create", "update", "delete"):
        assert allowed("resource.k8s.io", "resourceslices", verb), verb
    assert allowed("resource.k8s.io", "resourceclaims", "get")
    assert allowed("", "nodes", "get")
    assert not allowed("resource.k8s.io", "resourceclaims", "update")
    assert not allowed("", "pods", "list")
    assert not allowed("", "secrets", "get")


def test_doc_examples_are_accepted_by_the_api_server(api: Any, namespace: str) -> None:
    """The DeviceClasses, claims, templates and pods of docs/dra.md pass the API
    server's validation (CEL compiled), in a dry run."""
    from kubernetes import client

    from tests.test_dra_docs import manifests

    resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    create = {
        "DeviceClass": lambda body: resource.create_device_class(body, dry_run="All"),
        "ResourceClaim": lambda body: resource.create_namespaced_resource_claim(
            namespace, body, dry_run="All"
        ),
        "ResourceClaimTemplate": lambda body: resource.create_namespaced_resource_claim_template(
            namespace, body, dry_run="All"
        ),
        "Pod": lambda body: core.create_namespaced_pod(namespace, body, dry_run="All"),
    }
    objects = manifests()
    assert {o["kind"] for o in objects} == set(create)
    for body in objects:
        create[body["kind"]](body)


def test_kubelet_command_runs_the_pods_bound_to_its_node(
    kubeconfig: str, api: Any, namespace: str, short_tmp: Path
) -> None:
    """`devplug kubelet --kubeconfig K --node-name N` admits the pods bound to N."""
    from kubernetes import client

    dirs = NodeDirs(short_tmp)
    kubelet = kubelet_process(dirs, "--kubeconfig", kubeconfig, "--node-name", "node-b")
    try:
        body = {
            "metadata": {"name": "bound"},
            "spec": {"nodeName": "node-b", "containers": [{"name": "app", "image": "x"}]},
        }
        client.CoreV1Api(api).create_namespaced_pod(namespace, body)
        result = first_result(kubelet)
        assert (result["pod"], result["namespace"], result["admitted"]) == (
            "bound",
            namespace,
            True,
        )
    finally:
        kubelet.terminate()
        kubelet.wait(timeout=15)
