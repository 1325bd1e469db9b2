"""Device health through DRA against the real scheduler: an unhealthy device is
tainted in the slice (value: why) and given only to claims that tolerate it (which
Xids taint a GPU: test_dra_xid_policy.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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
