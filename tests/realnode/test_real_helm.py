"""The Helm chart installed on the real node (real kubelet, containerd, runc) by the Helm
SDK (helm-python-sdk: Helm's own install and uninstall, no helm binary): the pod Ready,
and a pod given its device through the device plugin and through DRA. Also the reach of
the shipped kustomize base: a node tainted for other work still gets the plugin.

Skipped, saying what to provide, where the node cannot run (see tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from node_helpers import DEFAULT_RESOURCES, DEPLOY, NAMESPACE, deployed

from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import RealNode, capacity

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

helm = pytest.importorskip("helm_python", reason="the Helm SDK comes with the dev group")

CHART = DEPLOY / "helm" / "devplug"
NULL = "devplug.io/null"
TAINT = {"key": "dedicated", "value": "fpga", "effect": "NoSchedule"}


def the_node_api(node: RealNode) -> list[dict[str, str]]:
    """The API server's address for the pods: the test node has no kube-proxy, so the
    `kubernetes` Service address leads nowhere (as node_helpers' overlay sets it)."""
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(node.apiserver_port)},
    ]


@contextlib.contextmanager
def installed(node: RealNode, values: dict[str, Any], release: str = "devplug") -> Iterator[str]:
    """`helm install --create-namespace` of the chart (the namespace then labelled for
    the privileged Pod Security level, as docs/deploy.md says), until the DaemonSet's pod
    is Ready (its name is yielded); `helm uninstall` afterwards, waited for, and the
    namespace deleted."""
    with helm.Config(kubeconfig_path=node.kubeconfig, namespace=NAMESPACE) as config:
        release_info = config.install(
            CHART, release, values, namespace=NAMESPACE, create_namespace=True, timeout=120
        )
        try:
            assert release_info["status"] == "deployed", release_info
            node.kubectl(
                *("label", "namespace", NAMESPACE, "--overwrite"),
                "pod-security.kubernetes.io/enforce=privileged",
            )
            yield node.rolled_out(NAMESPACE, release)
        finally:
            config.uninstall(release, wait="watcher", timeout=120)
            node.kubectl(
                *("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s"),
                timeout=150,
                check=False,
            )


@contextlib.contextmanager
def tainted(node: RealNode, taint: dict[str, str]) -> Iterator[None]:
    spec = f"{taint['key']}={taint['value']}:{taint['effect']}"
    node.kubectl("taint", "node", node.node_name, spec, "--overwrite")
    try:
        yield
    finally:
        node.kubectl("taint", "node", node.node_name, f"{spec}-", check=False)


def env_of(node: RealNode, ns: str, pod: str) -> dict[str, str]:
    out = node.kubectl("exec", "-n", ns, pod, "--", "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def tolerating_pod(node: RealNode, ns: str, name: str, resources: dict[str, int]) -> None:
    """A busybox pod asking for `resources` that tolerates TAINT; waited for Ready."""
    pod = node.busybox_pod(name, resources, namespace=ns)
    pod["spec"]["tolerations"] = [{**TAINT, "operator": "Equal"}]
    node.create(pod)
    node.wait_pod(ns, name)


def test_the_chart_serves_devices_through_the_device_plugin_on_a_tainted_node(
    real_node: RealNode, real_node_image: str
) -> None:
    """The chart with its defaults, on a node tainted dedicated=fpga:NoSchedule: the
    plugin pod Ready (it tolerates every NoSchedule taint), the default resources in the
    node's capacity, and a pod tolerating the taint given /dev/null by the kubelet
    through the plugin."""
    with tainted(real_node, TAINT), installed(real_node, {}) as pod:
        real_node.wait_node(
            lambda n: all(capacity(n, r) == c for r, c in DEFAULT_RESOURCES.items())
        )
        [running] = real_node.daemon_pods(NAMESPACE, "devplug")
        assert running["metadata"]["name"] == pod
        assert running["spec"]["containers"][0]["image"] == real_node_image
        with real_node.namespace("helm") as ns:
            tolerating_pod(real_node, ns, "user", {NULL: 1})
            assert re.fullmatch(
                r"null::[0-3]", env_of(real_node, ns, "user")["DEVPLUG_DEVPLUG_IO_NULL"]
            )
            listed = real_node.kubectl("exec", "-n", ns, "user", "--", "ls", "-l", "/dev/null")
            assert listed.stdout.startswith("c")


def test_the_chart_dra_variant_serves_a_device_through_dra(
    real_node: RealNode, real_node_image: str
) -> None:
    """variants/dra.yaml: the pod Ready, its devices in ResourceSlices, and a pod asking
    `devplug.io/null: 1` by count given the device by a claim the scheduler made from
    the chart's DeviceClass, prepared by devplug (its env in the container)."""
    from kubernetes import client

    values = yaml.safe_load((CHART / "variants" / "dra.yaml").read_text())
    values["extraEnv"] = the_node_api(real_node)
    resource = client.ResourceV1Api(real_node.api)
    try:
        with installed(real_node, values):
            for driver, count in (("fake.devplug.io", 8), ("null.devplug.io", 1)):
                watch_until(
                    real_node.api,
                    resource.list_resource_slice,
                    lambda s, d=driver, n=count: (
                        s["spec"]["driver"] == d and len(s["spec"].get("devices") or []) == n
                    ),
                    60,
                    field_selector=f"spec.nodeName={real_node.node_name}",
                )
            with real_node.namespace("helm-dra") as ns:
                real_node.create(real_node.busybox_pod("counted", {NULL: 1}, namespace=ns))
                counted = real_node.wait_pod(ns, "counted")
                made = counted["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
                assert env_of(real_node, ns, "counted")["DEVPLUG_DEVPLUG_IO_NULL"] == "null"
                claim = json.loads(
                    resource.read_namespaced_resource_claim(made, ns, _preload_content=False).data
                )
                [result] = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["device"]) == ("null.devplug.io", "null")
    finally:
        # The kubelet removes a gone driver's slices only after a grace period: leave
        # the node as it was for the next test.
        real_node.kubectl(
            *("delete", "resourceslices", "-l", "app.kubernetes.io/managed-by=devplug"),
            f"--field-selector=spec.nodeName={real_node.node_name}",
            check=False,
        )


def test_the_shipped_base_reaches_a_node_tainted_for_other_work(
    real_node: RealNode, real_node_image: str
) -> None:
    """`kubectl apply -k deploy/` on a node tainted dedicated=fpga:NoSchedule: the
    plugin pod still lands there, becomes Ready, and registers every resource."""
    with tainted(real_node, TAINT), deployed(real_node, DEPLOY) as pod:
        [running] = real_node.daemon_pods(NAMESPACE, "devplug")
        assert running["metadata"]["name"] == pod
        assert running["spec"]["nodeName"] == real_node.node_name
        real_node.wait_node(
            lambda n: all(capacity(n, r) == c for r, c in DEFAULT_RESOURCES.items())
        )
