"""A node's DRA life beside the API server: the mode a node label chooses, the slices
the kubelet wipes at start and after a driver goes, the kubelet command following the
API server, and two instances of a rolling update serving side by side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devplug.apiserver.client import KubeApi
from devplug.simulator.dra import NodeSlices
from tests.dra_cluster_helpers import (
    WAIT_S,
    admitted,
    claim_body,
    device_class_made,
    driver_class,
    following,
    gone,
    node_kubelet,
    node_serving,
    our_slice,
    pod_body,
    slice_where,
)
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
from tests.serve_helpers import wait_for_log

MODE_LABEL = "example.com/acc-mode"


@pytest.fixture
def labelled_dra(api: Any, node: str) -> Iterator[str]:
    """NODE labelled to take the resource through DRA, while the test runs."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: "dra"}}})
    yield MODE_LABEL
    core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: None}}})


async def test_a_node_label_chooses_the_mode_on_that_node(
    kubeconfig: str, api: Any, labelled_dra: str, dirs: NodeDirs
) -> None:
    """`mode: devicePlugin` with `nodeModeLabel`: the node labelled `dra` gets the
    resource through DRA only (its driver registered, its slice published), not as a
    counted resource."""
    config = accelerator_config(
        dirs, {"acc0": "u250"}, mode="devicePlugin", nodeModeLabel=labelled_dra
    )
    async with node_serving(dirs, api, kubeconfig, config, DRIVER) as kubelet:
        await slice_where(api, our_slice(lambda d: "acc0" in d))
        assert kubelet.registrations(RESOURCE) == 0
        assert kubelet.resource_status(RESOURCE) is None


async def test_the_simulator_wipes_the_node_slices_as_the_kubelet_does(
    kubeconfig: str, api: Any, node: str, dirs: NodeDirs, daemons: list[Daemon]
) -> None:
    """At start the kubelet deletes every slice of its node; when the last instance of
    a driver goes, it deletes that driver's slices after a grace period, unless the
    driver is back by then. The simulator does the same."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    config = accelerator_config(dirs, {"acc0": "u250"})
    stale = {
        "metadata": {"name": "left-from-before"},
        "spec": {
            "driver": "gone.example.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "x"}],
        },
    }
    resource.create_resource_slice(stale)

    def names() -> set[str]:
        answer = resource.list_resource_slice(
            field_selector=f"spec.nodeName={NODE}", _preload_content=False
        )
        return {s["metadata"]["name"] for s in json.loads(answer.data)["items"]}

    kube = KubeApi.from_kubeconfig(kubeconfig)
    slices = NodeSlices(kube, NODE)
    async with kube, node_kubelet(dirs, kube, slices) as kubelet:
        await kubelet.wait_for(lambda: slices.wiped == 1, what="the start-up wipe")
        assert "left-from-before" not in names()
        command = serve_command(dirs, config, kubeconfig=kubeconfig)
        daemons.append(daemon := Daemon(command, dirs.root / "daemon.log"))
        await kubelet.wait_for_registration(DRIVER, timeout=WAIT_S)
        ours = await slice_where(api, our_slice(lambda d: "acc0" in d))
        # Stopped and back within the grace (the kubelet's 30 s): nothing wiped.
        slices.wiping_delay = 30.0
        seen = kubelet.registrations(DRIVER)
        daemon.stop()
        daemons.append(daemon := Daemon(command, dirs.root / "daemon.log"))
        await kubelet.wait_for_registration(DRIVER, after=seen, timeout=WAIT_S)
        assert slices.wiped == 1
        # Stopped for good: its slices go once the grace is over (shortened).
        slices.wiping_delay = 0.5
        daemon.stop()
        await kubelet.wait_for(lambda: slices.wiped == 2, timeout=WAIT_S, what="the wipe")
        assert ours["metadata"]["name"] not in names()


@pytest.fixture
def kubelet_of_node_b(kubeconfig: str, dirs: NodeDirs) -> Iterator[subprocess.Popen[str]]:
    """`devplug kubelet --kubeconfig K --node-name node-b`, as a process."""
    kubelet = kubelet_process(dirs, "--kubeconfig", kubeconfig, "--node-name", "node-b")
    yield kubelet
    kubelet.terminate()
    kubelet.wait(timeout=15)


def test_kubelet_command_runs_the_pods_bound_to_its_node(
    kubelet_of_node_b: subprocess.Popen[str], api: Any, namespace: str
) -> None:
    """`devplug kubelet --kubeconfig K --node-name N` admits the pods bound to N."""
    from kubernetes import client

    body = {
        "metadata": {"name": "bound"},
        "spec": {"nodeName": "node-b", "containers": [{"name": "app", "image": "x"}]},
    }
    client.CoreV1Api(api).create_namespaced_pod(namespace, body)
    result = first_result(kubelet_of_node_b)
    assert (result["pod"], result["namespace"], result["admitted"]) == ("bound", namespace, True)


@pytest.fixture
def slice_deletions(api: Any) -> Iterator[Callable[[], list[str]]]:
    """From when it is called, the names of NODE's slices of DRIVER deleted (a watch
    until the test ends)."""
    from kubernetes import client, watch
    from urllib3.exceptions import HTTPError

    resource = client.ResourceV1Api(api)
    deleted: list[str] = []
    watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]

    def record() -> None:
        selector = f"spec.nodeName={NODE},spec.driver={DRIVER}"
        with contextlib.suppress(HTTPError, OSError):  # the watch ends with the test
            for event in watcher.stream(resource.list_resource_slice, field_selector=selector):
                if event["type"] == "DELETED":
                    deleted.append(event["object"].metadata.name)

    def start() -> list[str]:
        threading.Thread(target=record, daemon=True).start()
        return deleted

    yield start
    watcher.stop()


@pytest.fixture
def surge_class(api: Any) -> Iterator[str]:
    with device_class_made(api, driver_class("surge.example.com")) as body:
        yield body["metadata"]["name"]


async def test_two_instances_of_a_rolling_update_serve_side_by_side(
    kubeconfig: str,
    api: Any,
    node: str,
    namespace: str,
    dirs: NodeDirs,
    surge_class: str,
    daemons: list[Daemon],
    slice_deletions: Callable[[], list[str]],
) -> None:
    """A rolling update with surge on one node: a second devplug (another pod UID)
    starts while the first has a claim prepared. The kubelet registers the second and
    calls it: it unprepares the first one's claim (one checkpoint, under a file lock)
    and prepares a new claim; the first leaves the slices to the newer instance and
    stops. The slice is never deleted meanwhile."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    config = accelerator_config(dirs, {"acc0": "u250", "acc1": "u280"})
    old_socket = dirs.registry / f"{DRIVER}-0001-old-reg.sock"
    new_socket = dirs.registry / f"{DRIVER}-0002-new-reg.sock"

    async with (
        KubeApi.from_kubeconfig(kubeconfig) as kube,
        node_kubelet(dirs, kube) as kubelet,
        following(kubelet, kube),
    ):
        command = serve_command(dirs, config, kubeconfig=kubeconfig)
        daemons.append(old := Daemon(command, dirs.root / "old.log", {"POD_UID": "0001-old"}))
        await kubelet.wait_for_registration(DRIVER, timeout=WAIT_S)
        await slice_where(api, our_slice(lambda d: len(d) == 2))
        deleted = slice_deletions()
        first = resource.create_namespaced_resource_claim(
            namespace, claim_body("first", "u250", surge_class)
        )
        core.create_namespaced_pod(namespace, pod_body("pod-first", "first"))
        await admitted(kubelet, "pod-first", namespace)
        first_spec = dirs.cdi / f"{DRIVER}-{first.metadata.uid}.json"
        assert first_spec.exists()

        seen = kubelet.registrations(DRIVER)
        daemons.append(new := Daemon(command, dirs.root / "new.log", {"POD_UID": "0002-new"}))
        await kubelet.wait_for_registration(DRIVER, after=seen, timeout=WAIT_S)
        assert old_socket.exists()
        assert new_socket.exists()
        await asyncio.to_thread(
            wait_for_log,
            dirs.root / "old.log",
            "is published by a newer devplug instance: left alone",
        )
        # The new instance unprepares what the old one prepared.
        core.delete_namespaced_pod("pod-first", namespace, grace_period_seconds=0)
        await gone(kubelet, "pod-first", namespace)
        assert not first_spec.exists()
        assert "unprepared claim" in (dirs.root / "new.log").read_text()
        second = resource.create_namespaced_resource_claim(
            namespace, claim_body("second", "u280", surge_class)
        )
        core.create_namespaced_pod(namespace, pod_body("pod-second", "second"))
        await admitted(kubelet, "pod-second", namespace)
        assert (dirs.cdi / f"{DRIVER}-{second.metadata.uid}.json").exists()
        assert old.stop() == 0
        assert not old_socket.exists()
        assert new_socket.exists()
        checkpoint = json.loads((dirs.plugins / DRIVER / "prepared-claims.json").read_text())
        assert set(checkpoint["claims"]) == {second.metadata.uid}
        new.stop()
    assert deleted == []
