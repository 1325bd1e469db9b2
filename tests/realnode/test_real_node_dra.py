"""DRA through the real kubelet v1.36.2 on the real node (containerd 2.3 with CDI):
`devplug serve` as a host process of the node registers its driver, publishes slices,
and prepares what the real scheduler and the resourceclaim controller allocate: a pod
with a ResourceClaimTemplate, and a pod asking the driver's extended resource by
count with no claim. The containers see the device nodes and env of the CDI specs, and
their device metadata files;
deleted pods are unprepared; after kubelet restarts (SIGTERM and SIGKILL) the slices
the kubelet wipes at start are back and new claims are prepared; and a rolling update
of deploy/dra (run once, each test checking one behaviour of it) loses nothing.

Skipped, saying what to provide, where the node cannot run (see tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.framework.dra.classes import device_class
from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import RealNode, pod_ready
from tests.serve_helpers import wait_for_log

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "devplug.io/dratest"
DRIVER = "dratest.devplug.io"
DEVICES = ("devplug-dratest0", "devplug-dratest1")
CDI_DIR = Path("/var/run/cdi")
ENV = "DEVPLUG_DEVPLUG_IO_DRATEST"

pytestmark = [pytest.mark.timeout(300)]


@dataclass
class DraNode:
    node: RealNode
    log: Path
    process: subprocess.Popen[bytes]

    def slices(self) -> list[dict[str, Any]]:
        from kubernetes import client

        answer = client.ResourceV1Api(self.node.api).list_resource_slice(
            field_selector=f"spec.driver={DRIVER}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return items

    def wait_slice(self, test: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
        from kubernetes import client

        try:
            return watch_until(
                self.node.api,
                client.ResourceV1Api(self.node.api).list_resource_slice,
                lambda s: s["spec"]["driver"] == DRIVER and test(s),
                timeout,
            )
        except TimeoutError:
            state = "running" if self.process.poll() is None else f"exited {self.process.poll()}"
            wiped = [line for line in self.node.kubelet_lines() if "Deleted ResourceSlices" in line]
            raise AssertionError(
                f"no such slice of {DRIVER}; devplug {state}, its log ends:\n"
                + "\n".join(self.log.read_text().splitlines()[-25:])
                + "\nthe kubelet's wipes:\n"
                + "\n".join(wiped[-4:])
            ) from None

    def running(self, ns: str, pod: str) -> dict[str, Any]:
        """The pod once Ready; on a timeout, what the API and devplug say of it."""
        try:
            return self.node.wait_pod(ns, pod)
        except TimeoutError:
            described = self.node.kubectl("describe", "pod", "-n", ns, pod, check=False).stdout
            raise AssertionError(
                f"pod {ns}/{pod} not Ready:\n{described[-2500:]}\ndevplug's log ends:\n"
                + "\n".join(self.log.read_text().splitlines()[-15:])
            ) from None

    def gone(self, ns: str, pod: str, claim: str) -> None:
        """Delete the pod and wait until the kubelet had devplug unprepare its claim:
        the device is free again before the next test restarts the kubelet (a kubelet
        started after a pod vanished unprepares its claim only in its next sweep)."""
        from kubernetes import client

        client.CoreV1Api(self.node.api).delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        wait_for_log(self.log, f"unprepared claim {ns}/{claim}")

    def in_pod(self, ns: str, pod: str, script: str) -> str:
        done = self.node.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", script, check=False)
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dra(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraNode]:
    """devplug serving two devices of RESOURCE through DRA on the node, with the
    DeviceClass `devplug check --device-classes` gives it; all gone afterwards."""
    from kubernetes import client

    folder = tmp_path_factory.mktemp("dra")
    for name in DEVICES:
        os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    config = folder / "dra.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "name": RESOURCE,
                        "mode": "dra",
                        # Each container of a claim gets its device metadata file.
                        "dra": {"deviceMetadata": True},
                        "groups": [
                            {"id": f"dra{i}", "paths": [{"path": f"/dev/{name}"}], "numaNode": i}
                            for i, name in enumerate(DEVICES)
                        ],
                    }
                ]
            }
        )
    )
    resource = client.ResourceV1Api(real_node.api)
    resource.create_device_class(device_class(DRIVER, RESOURCE))
    log = folder / "serve.log"
    command = [
        *(sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config)),
        *("--kubeconfig", str(real_node.kubeconfig), "--node-name", real_node.node_name),
        *("--plugin-dir", str(folder / "dp")),  # no device plugin: kept off the kubelet's
        # ...but the DRA driver registers with the kubelet's own folders.
        *("--registry-dir", "/var/lib/kubelet/plugins_registry"),
        *("--dra-socket-dir", "/var/lib/kubelet/plugins"),
    ]
    with log.open("wb") as out:
        process = real_node.popen(*command, stdout=out, stderr=subprocess.STDOUT)
    try:
        # A Python daemon entering the node's namespace and importing the Kubernetes
        # client takes more than 10 s on a busy machine (seen at a load of 20 on 2 cores).
        wait_for_log(log, f"{DRIVER}: registered with the kubelet", timeout=90)
        yield DraNode(real_node, log, process)
    finally:
        process.terminate()
        process.wait(timeout=30)
        resource.delete_device_class(DRIVER)
        for item in DraNode(real_node, log, process).slices():  # the kubelet would, 30 s on
            resource.delete_resource_slice(item["metadata"]["name"])
        for name in DEVICES:
            os.unlink(f"/dev/{name}")


def claim_template(name: str) -> dict[str, Any]:
    request = {"name": "dev", "exactly": {"deviceClassName": DRIVER}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def claim_pod(node: RealNode, name: str, ns: str, template: str) -> dict[str, Any]:
    pod = node.busybox_pod(name, namespace=ns)
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
    return pod


def sees_one_device(dra: DraNode, ns: str, pod: str) -> str:
    """The device the container got (its node and its env), checked inside it."""
    env = dra.in_pod(ns, pod, f"echo ${ENV}")
    device = env.strip()
    assert device in ("dra0", "dra1"), env
    node = DEVICES[int(device[-1])]
    listing = dra.in_pod(ns, pod, f"ls -l /dev/{node}")
    assert listing.startswith("c"), listing  # a character device: the CDI node
    assert "1,   3" in listing, listing
    other = DEVICES[1 - int(device[-1])]
    assert "No such file" in dra.in_pod(ns, pod, f"ls /dev/{other}")
    return device


def test_a_claim_and_a_count_are_prepared_through_the_real_kubelet(dra: DraNode) -> None:
    from kubernetes import client

    node = dra.node
    resource = client.ResourceV1Api(node.api)
    published = dra.wait_slice(lambda s: len(s["spec"].get("devices") or []) == 2)
    assert published["spec"]["nodeName"] == node.node_name
    with node.namespace("dra") as ns:
        # A claim from a template: made by the resourceclaim controller, allocated by the
        # scheduler, prepared by devplug through the kubelet.
        resource.create_namespaced_resource_claim_template(ns, claim_template("one"))
        node.create(claim_pod(node, "claimed", ns, "one"))
        pod = dra.running(ns, "claimed")
        [claimed] = pod["status"]["resourceClaimStatuses"]
        claim = resource.read_namespaced_resource_claim(claimed["resourceClaimName"], ns)
        uid = claim.metadata.uid
        spec = CDI_DIR / f"{DRIVER}-{uid}.json"
        assert spec.exists()
        first = sees_one_device(dra, ns, "claimed")
        status = json.loads(
            resource.read_namespaced_resource_claim(
                claimed["resourceClaimName"], ns, _preload_content=False
            ).data
        )
        [entry] = status["status"].get("devices") or [None]
        assert entry is not None
        assert entry["data"]["deviceID"] == first

        # By count, no claim: the scheduler makes the claim from the DeviceClass.
        node.create(node.busybox_pod("counted", {RESOURCE: 1}, namespace=ns))
        counted = dra.running(ns, "counted")
        made = counted["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        assert "-extended-resources-" in made
        assert sees_one_device(dra, ns, "counted") != first

        # Deleted: unprepared, its CDI spec gone.
        dra.gone(ns, "claimed", claimed["resourceClaimName"])
        assert not spec.exists()
        dra.gone(ns, "counted", made)


def test_the_container_reads_its_device_metadata_and_the_slice_has_the_standard_numa_node(
    dra: DraNode,
) -> None:
    """Kubernetes 1.37's additions that a 1.36.2 node already carries: the slices hold
    `resource.kubernetes.io/numaNode` beside `numaNode` (the API server stores it), and
    the container of a claim made from a template reads its device metadata file at
    the path its pod spec names, bind-mounted by containerd through the CDI spec."""
    from kubernetes import client

    node = dra.node
    published = dra.wait_slice(lambda s: len(s["spec"].get("devices") or []) == 2)
    numa = {
        d["name"]: (d["attributes"]["numaNode"], d["attributes"]["resource.kubernetes.io/numaNode"])
        for d in published["spec"]["devices"]
    }
    assert numa == {"dra0": ({"int": 0}, {"int": 0}), "dra1": ({"int": 1}, {"int": 1})}
    resource = client.ResourceV1Api(node.api)
    with node.namespace("dra") as ns:
        resource.create_namespaced_resource_claim_template(ns, claim_template("meta"))
        node.create(claim_pod(node, "meta", ns, "meta"))
        pod = dra.running(ns, "meta")
        device = sees_one_device(dra, ns, "meta")
        path = (
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/dev/dev/"
            f"{DRIVER}-metadata.json"
        )
        text = dra.in_pod(ns, "meta", f"cat {path}")
        [doc] = [json.loads(line) for line in text.splitlines()]
        assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
        assert doc["podClaimName"] == "dev"
        [request] = doc["requests"]
        [described] = request["devices"]
        assert (described["driver"], described["pool"]) == (DRIVER, node.node_name)
        assert described["name"] == device
        assert described["attributes"]["resource.kubernetes.io/numaNode"] == {
            "int": int(device[-1])
        }
        # Read-only in the container.
        assert "Read-only" in dra.in_pod(ns, "meta", f"echo x >> {path}")
        claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        dra.gone(ns, "meta", claim)


@pytest.mark.parametrize("kill", [False, True], ids=["SIGTERM", "SIGKILL"])
def test_after_a_kubelet_restart_the_slices_are_back_and_claims_are_prepared(
    dra: DraNode, kill: bool
) -> None:
    """The kubelet wipes the node's slices when it starts; devplug puts them back
    (measured: from the kubelet's start to the slice back), and a new claim is
    allocated and prepared."""
    from kubernetes import client

    node = dra.node
    resource = client.ResourceV1Api(node.api)
    before = dra.wait_slice(lambda s: len(s["spec"].get("devices") or []) == 2)
    restored = dra.log.read_text().count("was deleted by someone else: restoring it")
    start = node.restart_kubelet(kill=kill)
    back = dra.wait_slice(lambda s: s["metadata"]["uid"] != before["metadata"]["uid"])
    # The figure itself is bench/dra.py's (real_node.dra); -s shows this run's.
    took = time.time() - start.started
    print(f"kubelet {'SIGKILL' if kill else 'SIGTERM'}: slices back {took:.2f} s after its start")
    assert back["spec"]["devices"] == before["spec"]["devices"]
    wait_for_log(dra.log, "was deleted by someone else: restoring it", restored + 1)
    with node.namespace("dra") as ns:
        resource.create_namespaced_resource_claim_template(ns, claim_template("again"))
        node.create(claim_pod(node, "again", ns, "again"))
        again = dra.running(ns, "again")
        assert pod_ready(again)
        sees_one_device(dra, ns, "again")
        dra.gone(ns, "again", again["status"]["resourceClaimStatuses"][0]["resourceClaimName"])


@dataclass(frozen=True)
class RollingUpdate:
    """deploy/dra updated while a claim ('before') is prepared and a new claim
    ('during') arrives; then the pod of 'before' deleted."""

    first: str  # the devplug pod before the update
    second: str  # the devplug pod after it
    spec_before: bool  # the CDI spec of 'before' was there before the update
    most_running: int  # the most devplug pods Ready at once
    during_ready: bool
    before_ready: bool  # once the update rolled out
    spec_kept: bool  # the CDI spec of 'before', once the update rolled out
    spec_gone: bool  # the same, once its pod was deleted
    unprepared_by_second: bool  # the new devplug pod's log says it unprepared the claim
    slices_deleted: list[str]  # the node's slices deleted meanwhile


@pytest.fixture(scope="module")
def rolling_update(
    real_node: RealNode, real_node_image: str, tmp_path_factory: pytest.TempPathFactory
) -> RollingUpdate:
    """The update, run once, watching the node's slices and devplug's pods throughout."""
    import threading
    import uuid

    from kubernetes import client, watch
    from node_helpers import NAMESPACE, deployed, overlay

    from tests.serve_helpers import wait_for_gone

    node = real_node
    resource = client.ResourceV1Api(node.api)
    fake = "fake.devplug.io"
    deleted: list[str] = []
    running: dict[str, bool] = {}
    most = [0]
    watchers: list[Any] = []

    stopped = threading.Event()

    def follow(list_call: Any, seen: Callable[[str, Any], None], **selector: str) -> None:
        """Every event until the story ends. A watch the API server ends with an error
        (a 504 "Too large resource version" while the kubelet restarts) is started again
        from a new list, so that no deletion goes unseen and `deleted == []` means it."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        while not stopped.is_set():
            w: Any = watch.Watch()  # type: ignore[no-untyped-call]
            watchers.append(w)
            try:
                with contextlib.suppress(HTTPError, OSError, ValueError):  # ends with the story
                    for event in w.stream(list_call, **selector):
                        seen(event["type"], event["object"])
            except ApiException:
                continue

    def slice_seen(kind: str, obj: Any) -> None:
        if kind == "DELETED":
            deleted.append(obj.metadata.name)

    def pod_seen(kind: str, obj: Any) -> None:
        ready = any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions or [])
        running[obj.metadata.name] = kind != "DELETED" and ready
        most[0] = max(most[0], sum(running.values()))

    def claimed(name: str, ns: str) -> dict[str, Any]:
        pod = node.busybox_pod(name, namespace=ns)
        pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": "fake"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
        return pod

    template = claim_template("fake")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = fake
    folder = tmp_path_factory.mktemp("surge")
    with (
        deployed(node, overlay(folder / "dra", "dra", node)) as first,
        node.namespace("surge") as ns,
    ):
        resource.create_namespaced_resource_claim_template(ns, template)
        node.create(claimed("before", ns))
        before = node.wait_pod(ns, "before")
        claim = before["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        uid = resource.read_namespaced_resource_claim(claim, ns).metadata.uid
        spec = CDI_DIR / f"{fake}-{uid}.json"
        spec_before = spec.exists()
        for target, args in (
            (resource.list_resource_slice, {"field_selector": f"spec.nodeName={node.node_name}"}),
            (
                client.CoreV1Api(node.api).list_namespaced_pod,
                {"namespace": NAMESPACE, "label_selector": "app.kubernetes.io/name=devplug"},
            ),
        ):
            seen = slice_seen if target == resource.list_resource_slice else pod_seen
            threading.Thread(target=follow, args=(target, seen), kwargs=args, daemon=True).start()
        # The update: a new pod template, as a new image or config makes one.
        rollout = {"test/rollout": uuid.uuid4().hex}
        client.AppsV1Api(node.api).patch_namespaced_daemon_set(
            "devplug", NAMESPACE, {"spec": {"template": {"metadata": {"annotations": rollout}}}}
        )
        node.create(claimed("during", ns))
        second = node.rolled_out(NAMESPACE, "devplug")
        during_ready = pod_ready(node.wait_pod(ns, "during"))
        before_ready = pod_ready(node.wait_pod(ns, "before"))
        spec_kept = spec.exists()
        # The new pod unprepares what the old one prepared.
        client.CoreV1Api(node.api).delete_namespaced_pod("before", ns, grace_period_seconds=0)
        with contextlib.suppress(AssertionError):  # told by spec_gone
            wait_for_gone(spec, timeout=60)
        spec_gone = not spec.exists()
        log = node.kubectl("logs", "-n", NAMESPACE, second).stdout
    stopped.set()
    for w in watchers:
        w.stop()
    return RollingUpdate(
        first,
        second,
        spec_before,
        most[0],
        during_ready,
        before_ready,
        spec_kept,
        spec_gone,
        f"unprepared claim {ns}/{claim}" in log,
        deleted,
    )


@pytest.mark.slow
def test_a_rolling_update_starts_a_new_devplug_pod(rolling_update: RollingUpdate) -> None:
    assert rolling_update.spec_before  # the claim was prepared by the old pod
    assert rolling_update.second != rolling_update.first


@pytest.mark.slow
def test_the_new_devplug_pod_is_ready_beside_the_old_one(rolling_update: RollingUpdate) -> None:
    assert rolling_update.most_running == 2  # a surge


@pytest.mark.slow
def test_a_claim_arriving_during_the_update_is_prepared(rolling_update: RollingUpdate) -> None:
    assert rolling_update.during_ready


@pytest.mark.slow
def test_a_claim_prepared_before_the_update_keeps_its_device_throughout(
    rolling_update: RollingUpdate,
) -> None:
    assert rolling_update.before_ready
    assert rolling_update.spec_kept


@pytest.mark.slow
def test_the_new_devplug_pod_unprepares_what_the_old_one_prepared(
    rolling_update: RollingUpdate,
) -> None:
    assert rolling_update.spec_gone
    assert rolling_update.unprepared_by_second


@pytest.mark.slow
def test_no_slice_of_the_node_is_deleted_during_the_update(
    rolling_update: RollingUpdate,
) -> None:
    assert rolling_update.slices_deleted == []
