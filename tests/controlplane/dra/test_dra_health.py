"""Device health through DRA against the real scheduler: an unhealthy device is
tainted in the slice (value: why) and given only to claims that tolerate it; the GPU
source's Xid policy decides which Xids taint a GPU, and for how long."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devplug.fakes.nvml import FakeGpuHost, gpu, gpu_uuid
from tests.dra_cluster_helpers import (
    admitted,
    claim_body,
    device_class_made,
    driver_class,
    node_serving,
    our_slice,
    pending,
    pod_body,
    scheduled_message,
    slice_devices,
    slice_where,
)
from tests.dra_helpers import DRIVER, NODE, NodeDirs, accelerator_config


@pytest.fixture
def tainted_class(api: Any) -> Iterator[str]:
    with device_class_made(api, driver_class("tainted.example.com")) as body:
        yield body["metadata"]["name"]


async def test_an_unhealthy_device_is_tainted_and_given_only_to_claims_that_tolerate_it(
    kubeconfig: str, api: Any, node: str, namespace: str, dirs: NodeDirs, tainted_class: str
) -> None:
    """A device whose node goes away stays in the slice with the taint
    devplug.io/unhealthy (value: why), which the real scheduler honours: a claim that
    does not tolerate it stays Pending, one that does is allocated the device and
    prepared. The kubelet's health stream says the same; the taint goes on recovery."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    config = accelerator_config(dirs, {"acc0": "u250", "acc1": "u280"})

    def u250_claim(name: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
        body = claim_body(name, "u250")
        exactly = body["spec"]["devices"]["requests"][0]["exactly"]
        exactly["deviceClassName"] = tainted_class
        if tolerations:
            exactly["tolerations"] = tolerations
        return body

    async with node_serving(dirs, api, kubeconfig, config, DRIVER) as kubelet:
        (dirs.dev / "acc0").unlink()
        tainted = await slice_where(
            api,
            our_slice(lambda d: "taints" in d.get("acc0", {})),
        )
        [taint] = slice_devices(tainted)["acc0"]["taints"]
        assert (taint["key"], taint.get("value"), taint["effect"]) == (
            "devplug.io/unhealthy",
            "device-node-missing",
            "NoSchedule",
        )
        dra = kubelet.dra
        assert dra is not None
        key = (DRIVER, NODE, "acc0")
        await kubelet.wait_for(
            lambda: dra.device_health.get(key) == "Unhealthy", what="acc0 unhealthy"
        )
        assert dra.device_health_message[key] == "device node missing"

        resource.create_namespaced_resource_claim(namespace, u250_claim("plain", []))
        core.create_namespaced_pod(namespace, pod_body("pod-plain", "plain"))
        refused = await pending(api, "pod-plain", namespace)
        assert "cannot allocate all claims" in scheduled_message(refused)

        toleration = {"key": "devplug.io/unhealthy", "operator": "Exists"}
        tolerant = resource.create_namespaced_resource_claim(
            namespace, u250_claim("tolerant", [toleration])
        )
        core.create_namespaced_pod(namespace, pod_body("pod-tolerant", "tolerant"))
        pod = await admitted(kubelet, "pod-tolerant", namespace)
        assert pod.containers[0].options.cdi_devices == [
            f"{DRIVER}/claim={tolerant.metadata.uid}-acc0"
        ]

        dirs.make_device("acc0")
        await slice_where(
            api,
            our_slice(lambda d: "acc0" in d and "taints" not in d["acc0"]),
        )
        await kubelet.wait_for(
            lambda: dra.device_health.get(key) == "Healthy", what="acc0 healthy again"
        )


async def test_the_xid_policy_decides_which_xids_taint_a_gpu(
    kubeconfig: str, api: Any, node: str, dirs: NodeDirs
) -> None:
    """GPUs served through DRA on the fake NVML: the GPU source's Xid policy (NVIDIA's
    catalog) decides what taints a GPU, with the configured effect: an ignored Xid
    (13) nothing; one needing a reset (79) a taint that stays; a transient one (94) a
    taint gone after the quiet time. The taint's value and the kubelet's health stream
    both say which Xid."""
    import yaml

    gpu_driver = "gpu.devplug.io"
    gpus = [gpu(i, name="NVIDIA A10", memory_gib=24, cc=(8, 6), numa=0) for i in range(4)]
    host = FakeGpuHost(dirs.root / "gpus", {"driver": {"loaded": True}, "gpus": gpus})
    nvidia = {"hostRoot": host.host_root, "recoverySeconds": 1, "probeSeconds": 0.05}
    entry = {
        "nvidia": nvidia,
        "mode": "dra",
        "dra": {"driver": gpu_driver, "taintEffect": "NoExecute"},
    }
    config = dirs.root / "gpus.yaml"
    config.write_text(yaml.safe_dump({"resources": [entry]}))

    def by_uuid(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {d["attributes"]["uuid"]["string"]: d for d in slice_devices(obj).values()}

    def taints(obj: dict[str, Any]) -> dict[int, list[tuple[str, str, str]]]:
        found = {}
        for index in range(4):
            listed = by_uuid(obj)[gpu_uuid(index)].get("taints") or []
            found[index] = [(t["key"], t.get("value", ""), t["effect"]) for t in listed]
        return found

    def ours(test: Callable[[dict[str, Any]], bool]) -> Any:
        return slice_where(
            api,
            lambda o: o["spec"]["driver"] == gpu_driver and len(slice_devices(o)) == 4 and test(o),
        )

    async with node_serving(dirs, api, kubeconfig, config, gpu_driver, host.env) as kubelet:
        await ours(lambda o: not any(taints(o).values()))
        # In order: the ignored Xid comes first and changes nothing.
        host.inject_xid(0, 13)
        host.inject_xid(1, 79)
        host.inject_xid(2, 94)
        tainted = await ours(lambda o: bool(taints(o)[1] and taints(o)[2]))
        unhealthy = "devplug.io/unhealthy"
        assert taints(tainted) == {
            0: [],
            1: [(unhealthy, "Xid-79-needs-a-reset", "NoExecute")],
            2: [(unhealthy, "Xid-94", "NoExecute")],
            3: [],
        }
        dra = kubelet.dra
        assert dra is not None
        name = by_uuid(tainted)[gpu_uuid(1)]["name"]
        await kubelet.wait_for(
            lambda: dra.device_health.get((gpu_driver, NODE, name)) == "Unhealthy",
            what="GPU 1 unhealthy in the health stream",
        )
        assert dra.device_health_message[(gpu_driver, NODE, name)] == "Xid 79, needs a reset"
        # The transient Xid's taint goes after the quiet time; the reset's stays.
        recovered = await ours(lambda o: not taints(o)[2])
        assert [i for i, t in taints(recovered).items() if t] == [1]
