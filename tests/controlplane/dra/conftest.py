"""DRA against a real control plane (etcd + kube-apiserver + kube-scheduler): the real
daemon publishes slices, the real scheduler allocates claims and binds pods, the
simulator's kubelet prepares them through the real node plugin. Skipped, saying how to
provide them, where the control-plane binaries are absent.

The fixtures every file shares: the API client, the node NODE, the deploy RBAC and a
service account's token bound to a pod on NODE, fresh namespaces and short folders. A
file whose tests check the behaviours of one expensive scenario (a daemon serving, a
claim allocated) builds it once, in module-scoped fixtures on the module's loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra_cluster_helpers import ROOT, device_class_made, fresh_namespace
from tests.dra_helpers import DRIVER, NODE, NodeDirs


@pytest.fixture(scope="session")
def node(api: Any) -> str:
    from kubernetes import client

    core = client.CoreV1Api(api)
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    core.patch_node_status(NODE, {"status": {"capacity": capacity, "allocatable": capacity}})
    core.patch_node(NODE, {"spec": {"taints": None}})
    return NODE


@pytest.fixture(scope="session")
def deploy_rbac(api: Any) -> None:
    """deploy/dra's RBAC for the service account devplug-system/devplug, its driver role
    made for the drivers of these tests as `devplug check --device-classes` makes it."""
    import yaml
    from kubernetes import client, utils

    from devplug.framework.dra.classes import driver_status_role

    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "devplug-system"}})
    core.create_namespaced_service_account("devplug-system", {"metadata": {"name": "devplug"}})
    rbac = ROOT / "deploy" / "dra" / "component" / "rbac.yaml"
    objects = list(yaml.safe_load_all(rbac.read_text()))
    objects.append(driver_status_role([DRIVER, "gpu.devplug.io"]))
    utils.create_from_yaml(api, yaml_objects=objects)


@pytest.fixture(scope="session")
def sa_kubeconfig(
    kubeconfig: str, api: Any, node: str, deploy_rbac: None, tmp_path_factory: Any
) -> str:
    """A kubeconfig of the service account with the token its pod on NODE would get
    (bound to the pod, hence to the node): the daemon then has exactly the deploy
    RBAC, and the API server's node checks apply to it."""
    import yaml
    from kubernetes import client

    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        "devplug-system",
        {
            "metadata": {"name": "devplug-node-a"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "devplug",
                "containers": [{"name": "devplug", "image": "devplug/devplug"}],
            },
        },
    )
    bound = {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name, "uid": pod.metadata.uid}
    token = core.create_namespaced_service_account_token(
        "devplug", "devplug-system", {"spec": {"audiences": [], "boundObjectRef": bound}}
    ).status.token
    config = yaml.safe_load(Path(kubeconfig).read_text())
    config["users"][0]["user"] = {"token": token}
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def namespace(api: Any) -> Iterator[str]:
    """A fresh namespace for one test, emptied afterwards."""
    with fresh_namespace(api) as name:
        yield name


@pytest.fixture(scope="module")
def module_namespace(api: Any) -> Iterator[str]:
    """A fresh namespace for the scenario of one file, emptied afterwards."""
    with fresh_namespace(api) as name:
        yield name


@pytest.fixture
def dirs(short_tmp: Path) -> NodeDirs:
    """The folders of the simulated node, for one test."""
    return NodeDirs(short_tmp)


@pytest.fixture
def make_class(api: Any) -> Iterator[Callable[[dict[str, Any]], Any]]:
    """Makes a DeviceClass on the API server, deleted when the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda body: stack.enter_context(device_class_made(api, body))
