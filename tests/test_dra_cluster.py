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


# -- partitions and shared capacity, allocated by the real scheduler --------------------


def doc_objects(*names: str) -> list[dict[str, Any]]:
    """The objects of docs/dra.md with these names, in that order."""
    from tests.test_dra_docs import manifests

    found = {m["metadata"]["name"]: m for m in manifests()}
    return [found[n] for n in names]


def doc_config(marker: str) -> dict[str, Any]:
    import yaml

    from tests.test_dra_docs import blocks

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


async def published_by(
    api: Any, driver: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """A slice of `driver` that `predicate` accepts, once published."""
    from kubernetes import client

    return await asyncio.to_thread(
        watch_until,
        api,
        client.ResourceV1Api(api).list_resource_slice,
        lambda o: o["spec"]["driver"] == driver and predicate(o["spec"]),
    )


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


def test_the_scheduler_never_allocates_overlapping_partitions(
    kubeconfig: str, api: Any, node: str, namespace: str, short_tmp: Path
) -> None:
    """The doc's half-a-card claims and a one-slot claim, through the real scheduler:
    the partitions it allocates never share a slot, the rest wait, and the node
    prepares each with the card's device node."""
    import yaml
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    driver = "region.devplug.io"
    device_class, template, pod = doc_objects(driver, "half-fpga", "half-synth")
    resource.create_device_class(device_class)
    dirs = NodeDirs(short_tmp)
    card = dirs.make_device("fpga0")
    config = doc_config("region")
    config["resources"][0]["groups"][0]["paths"] = [{"path": str(card)}]
    path = dirs.root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    one_slot = variant(template, f'device.attributes["{driver}"].slots == 1')

    def slots(claim: str) -> set[int]:
        """The slots of the partition allocated to `claim` (none if it waits)."""
        results = allocation(resource, claim, namespace)
        if not results:
            return set()
        [result] = results
        assert (result["driver"], result["pool"]) == (driver, NODE)
        span = result["device"].removeprefix("fpga0-").split("-")[1:]
        return set(range(int(span[0]), int(span[-1]) + 1))

    async def scenario() -> None:
        async with node_serving(dirs, api, kubeconfig, path, driver) as kubelet:

            def running(*names: str) -> list[str]:
                pods = [(n, kubelet.pod(n, namespace)) for n in names]
                return [n for n, p in pods if p is not None and p.admitted]

            await published_by(api, driver, lambda spec: "sharedCounters" in spec)
            halves = [f"half-{i}" for i in range(3)]
            for i, name in enumerate(halves):
                resource.create_namespaced_resource_claim(namespace, claim_from(template, f"h{i}"))
                core.create_namespaced_pod(namespace, pod_from(pod, name, f"h{i}"))
            await kubelet.wait_for(lambda: len(running(*halves)) == 2, WAIT_S, "two halves")
            [waiting] = set(halves) - set(running(*halves))
            await asyncio.to_thread(unschedulable, api, waiting, namespace)
            first, second = (f"h{n[-1]}" for n in running(*halves))
            assert slots(first) | slots(second) == {0, 1, 2, 3}
            assert not slots(first) & slots(second)
            assert not slots(f"h{waiting[-1]}")

            # Every slot is taken: one slot waits too.
            resource.create_namespaced_resource_claim(namespace, claim_from(one_slot, "s0"))
            core.create_namespaced_pod(namespace, pod_from(pod, "slot", "s0"))
            pending = await asyncio.to_thread(unschedulable, api, "slot", namespace)
            assert "cannot allocate all claims" in scheduled_message(pending)

            # Each running half got the card's node and its partition in the env.
            for claim in (first, second):
                obj = resource.read_namespaced_resource_claim(claim, namespace)
                [device] = allocation(resource, claim, namespace)
                spec = json.loads((dirs.cdi / f"{driver}-{obj.metadata.uid}.json").read_text())
                [cdi] = spec["devices"]
                assert cdi["name"] == f"{obj.metadata.uid}-{device['device']}"
                assert [n["hostPath"] for n in cdi["containerEdits"]["deviceNodes"]] == [str(card)]
                env = f"DEVPLUG_EXAMPLE_COM_FPGA_REGION={device['device']}"
                assert env in spec["containerEdits"]["env"]

            # A half goes (its claim released, as the controller-manager would): what
            # waits is allocated in the slots it freed, never in the other half's.
            gone = f"half-{first[-1]}"
            core.delete_namespaced_pod(gone, namespace, grace_period_seconds=0)
            await kubelet.wait_for(
                lambda: kubelet.pod(gone, namespace) is None, WAIT_S, f"{gone} deleted"
            )
            freed, kept = slots(first), slots(second)
            release(resource, first, namespace)
            await kubelet.wait_for(
                lambda: bool(running(waiting, "slot")), WAIT_S, "a waiting pod scheduled"
            )
            taken = [slots(c) for c in (f"h{i}" for i in range(3)) if c != first]
            taken.append(slots("s0"))
            assert sum(map(len, taken)) == len(set().union(*taken)) <= 4
            new = set().union(*taken) - kept
            assert new
            assert new <= freed

    try:
        asyncio.run(scenario())
    finally:
        resource.delete_device_class(driver)


def test_the_scheduler_shares_a_gpu_by_memory(
    kubeconfig: str, api: Any, node: str, namespace: str, short_tmp: Path
) -> None:
    """The doc's 10 GiB share of a (fake NVML) 40 GiB GPU, through the real scheduler:
    claims share the one GPU while its memory lasts, a request is rounded up to the
    policy's step, each share is prepared with a CDI device of its own and unprepared
    alone."""
    import yaml
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    driver = "gpu.devplug.io"
    device_class, template, pod = doc_objects("gpu-share.devplug.io", "gpu-10gib-share", "infer")
    resource.create_device_class(device_class)
    dirs = NodeDirs(short_tmp)
    card = gpu(2, name="NVIDIA A100-SXM4-40GB", memory_gib=40, cc=(8, 0), numa=0)
    host = FakeGpuHost(dirs.root / "gpus", {"driver": {"loaded": True}, "gpus": [card]})
    config = doc_config("consumableCapacity")
    config["resources"][0]["nvidia"] = {"hostRoot": host.host_root}
    path = dirs.root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    odd = json.loads(json.dumps(template))
    [request] = odd["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["capacity"]["requests"]["memory"] = "1500Mi"
    claims = {"m0": template, "m1": template, "m2": template, "odd": odd}

    async def scenario() -> None:
        async with node_serving(dirs, api, kubeconfig, path, driver, host.env) as kubelet:

            def shared(spec: dict[str, Any]) -> bool:
                return any(d.get("allowMultipleAllocations") for d in spec.get("devices", []))

            await published_by(api, driver, shared)
            uids = {}
            for name, source in claims.items():
                body = claim_from(source, name)
                made = resource.create_namespaced_resource_claim(namespace, body)
                uids[name] = made.metadata.uid
                core.create_namespaced_pod(namespace, pod_from(pod, f"p-{name}", name))
            shares = {}
            for name, uid in uids.items():
                result = await admitted(kubelet, f"p-{name}", namespace)
                [share] = allocation(resource, name, namespace)
                shares[name] = share
                cdi = f"{uid}-{share['device']}-{share['shareID']}"
                assert result.containers[0].options.cdi_devices == [f"{driver}/claim={cdi}"]
                spec = json.loads((dirs.cdi / f"{driver}-{uid}.json").read_text())
                [device] = spec["devices"]
                assert device["name"] == cdi
                label = share["device"].upper().replace("-", "_")
                env = device["containerEdits"]["env"]
                assert f"DEVPLUG_DRA_SHARE_{label}={share['shareID']}" in env
                memory = share["consumedCapacity"]["memory"]
                assert f"DEVPLUG_DRA_SHARE_{label}_MEMORY={memory}" in env
                assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(2)}" in spec["containerEdits"]["env"]
            assert len({s["device"] for s in shares.values()}) == 1
            assert len({s["shareID"] for s in shares.values()}) == 4
            consumed = {n: s["consumedCapacity"]["memory"] for n, s in shares.items()}
            assert consumed == {"m0": "10Gi", "m1": "10Gi", "m2": "10Gi", "odd": "2Gi"}

            # 38 GiB taken: another 10 GiB waits.
            resource.create_namespaced_resource_claim(namespace, claim_from(template, "m3"))
            core.create_namespaced_pod(namespace, pod_from(pod, "p-m3", "m3"))
            pending = await asyncio.to_thread(unschedulable, api, "p-m3", namespace)
            assert "cannot allocate all claims" in scheduled_message(pending)

            # One share goes: the others keep their specs.
            core.delete_namespaced_pod("p-m0", namespace, grace_period_seconds=0)
            await kubelet.wait_for(
                lambda: kubelet.pod("p-m0", namespace) is None, WAIT_S, "p-m0 deleted"
            )
            assert not (dirs.cdi / f"{driver}-{uids['m0']}.json").exists()
            for name in ("m1", "m2", "odd"):
                assert (dirs.cdi / f"{driver}-{uids[name]}.json").exists()
            release(resource, "m0", namespace)
            await admitted(kubelet, "p-m3", namespace)

    try:
        asyncio.run(scenario())
    finally:
        resource.delete_device_class(device_class["metadata"]["name"])


POLICIES = [  # (request policy, what devplug's config check says, or None: accepted)
    ({"default": "10G", "validValues": ["10G", "25G", "50G"]}, None),
    ({"default": "1G", "validRange": {"min": "1G", "max": "9G", "step": "2G"}}, None),
    ({"default": "5G"}, None),
    ({"default": "5G", "validValues": ["10G", "25G"]}, "is not one of the valid values"),
    ({"default": "10G", "validValues": ["25G", "10G"]}, "distinct and in ascending order"),
    ({"default": "10G", "validValues": ["10G", "10G"]}, "distinct and in ascending order"),
    ({"default": "10G", "validValues": ["10G", "200G"]}, "'200G' is more than the capacity"),
    (
        {"default": "10G", "validValues": [f"{i}G" for i in range(10, 21)]},
        "more than 10 values",
    ),
    ({"default": "2G", "validRange": {"min": "1G", "step": "2G"}}, "not min plus a number"),
    ({"default": "1G", "validRange": {"min": "2G"}}, "outside the valid range"),
    ({"default": "200G", "validRange": {"min": "200G"}}, "is more than the capacity"),
    ({"default": "1G", "validRange": {"min": "1G", "max": "4G", "step": "2G"}}, "number of steps"),
    ({"default": "95G", "validRange": {"min": "95G", "step": "10G"}}, "min plus one step"),
    (
        {"default": "10G", "validValues": ["10G"], "validRange": {"min": "1G"}},
        "both 'validValues' and 'validRange'",
    ),
]


def test_the_api_server_accepts_what_the_config_accepts(api: Any) -> None:
    """The truth about field names and limits is the API server's: every slice a
    partitioned or shared config publishes is accepted (a pool of 20 partitioned cards
    too, in six slices), and each request policy the config check refuses, the API
    server refuses as well."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources import ConfigError, build_plugins, parse_config
    from devplug.sources.draconfig import config_driver

    resource = client.ResourceV1Api(api)

    def bodies(dra: dict[str, Any], cards: int = 1) -> list[dict[str, Any]]:
        groups = [
            {"id": f"card{i}", "paths": [{"path": "/dev/null"}], "attributes": {"memory": 8 << 30}}
            for i in range(cards)
        ]
        entry = {"name": "example.com/card", "mode": "dra", "dra": dra, "groups": groups}
        [plugin] = build_plugins(parse_config(yaml.safe_dump({"resources": [entry]})))
        plugin.publish(plugin.discover())
        return slice_bodies(config_driver(plugin), "api-check", 1)

    def refusal(body: dict[str, Any]) -> str | None:
        try:
            resource.create_resource_slice(body, dry_run="All")
        except ApiException as error:
            return f"{error.status} {json.loads(error.body)['message']}"
        return None

    def config_problem(dra: dict[str, Any]) -> str | None:
        try:
            bodies(dra)
        except ConfigError as error:
            return str(error)
        return None

    regions = {
        "counters": {"left": 4, "right": 4},
        "devices": [
            {"name": "left", "consumes": {"left": 4}, "env": {"REGION": "left"}},
            {"name": "quarter", "consumes": {"left": 1, "right": 1}},
            {"name": "whole", "consumes": {"left": 4, "right": 4}},
        ],
    }
    accepted = [
        *bodies({"partitions": {"slots": 32, "sizes": [1, 2, 4, 8, 16, 32]}}, cards=20),
        *bodies({"partitions": regions}),
        *bodies({"consumableCapacity": {"memory": {}}}),
    ]
    assert len(accepted) > 20
    assert [refusal(b) for b in accepted] == [None] * len(accepted)

    for policy, problem in POLICIES:
        capacity = {"bandwidth": {"value": "100G", "requestPolicy": policy}}
        said = config_problem({"consumableCapacity": capacity})
        device = {"name": "card0", "allowMultipleAllocations": True, "capacity": capacity}
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "api-check"},
            "spec": {
                "driver": "card.example.com",
                "nodeName": "api-check",
                "pool": {"name": "api-check", "generation": 1, "resourceSliceCount": 1},
                "devices": [device],
            },
        }
        refused = refusal(body)
        if problem is None:
            assert (said, refused) == (None, None), policy
        else:
            assert said is not None, policy
            assert problem in said
            assert refused is not None, policy
            assert refused.startswith("422 "), refused


def test_the_scheduler_allocates_mig_partitions_that_never_overlap(
    kubeconfig: str, api: Any, node: str, namespace: str, short_tmp: Path
) -> None:
    """The doc's MIG example on an A100 40GB in MIG mode (fake NVML): the real
    scheduler gives two 3g.20gb claims the two halves and leaves a 1g.5gb claim
    waiting; the node makes each instance at prepare."""
    import yaml
    from kubernetes import client

    from devplug.testing.fakegpus import gpu as mig_gpu

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    driver = "mig.devplug.io"
    device_class, template, pod = doc_objects(driver, "mig-3g", "finetune")
    resource.create_device_class(device_class)
    dirs = NodeDirs(short_tmp)
    description = {
        "driver": {"loaded": True},
        "gpus": [mig_gpu(0, model_key="A100-SXM4-40GB", mig=[])],
    }
    host = FakeGpuHost(dirs.root / "gpus", description)
    config = doc_config("{mig: true}")
    config["resources"][0]["nvidia"] = {"hostRoot": host.host_root}
    path = dirs.root / "config.yaml"
    path.write_text(yaml.safe_dump(config))

    small = variant(template, f'device.attributes["{driver}"].migProfile == "1g.5gb"')

    async def scenario() -> None:
        async with node_serving(dirs, api, kubeconfig, path, driver, host.env) as kubelet:
            await published_by(api, driver, lambda spec: "sharedCounters" in spec)
            for name in ("half-a", "half-b"):
                resource.create_namespaced_resource_claim(namespace, claim_from(template, name))
                core.create_namespaced_pod(namespace, pod_from(pod, f"p-{name}", name))
            for name in ("half-a", "half-b"):
                await admitted(kubelet, f"p-{name}", namespace)
            response = resource.list_resource_slice(_preload_content=False)
            offered = {
                d["name"]: d
                for s in json.loads(response.data)["items"]
                if s["spec"]["driver"] == driver
                for d in s["spec"].get("devices") or []
            }
            starts = []
            for name in ("half-a", "half-b"):
                [result] = allocation(resource, name, namespace)
                attributes = offered[result["device"]]["attributes"]
                assert attributes["migProfile"] == {"string": "3g.20gb"}
                starts.append(attributes["migPlacement"]["int"])
            assert sorted(starts) == [0, 4]
            resource.create_namespaced_resource_claim(namespace, claim_from(small, "small"))
            core.create_namespaced_pod(namespace, pod_from(pod, "p-small", "small"))
            pending = await asyncio.to_thread(unschedulable, api, "p-small", namespace)
            assert "cannot allocate all claims" in scheduled_message(pending)
            host.reload()
            made = sorted((g["start"], g["size"]) for g in host.gpu(0)["gpuInstances"])
            assert made == [(0, 4), (4, 4)]

    try:
        asyncio.run(scenario())
    finally:
        resource.delete_device_class(driver)
