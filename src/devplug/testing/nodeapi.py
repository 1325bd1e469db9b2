"""The real node through the API server: conditions on pods and the node, the node's
updates as a watch saw them, and waits, DaemonSets and pods over API watches and
kubectl."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from devplug.testing.controlplane import watch_until
from devplug.testing.pods import pod_manifest

ROLLOUT_S = 120.0
BUSYBOX = "docker.io/local/busybox:k8s"


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_phase(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") in phases


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it has refused `pod` (e.g. `0/1 nodes are
    available: 1 Insufficient devplug.io/null`), else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message") or c.get("reason") or "")
    return None


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    return int(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))


def capacity(node: Mapping[str, Any], resource: str) -> int:
    return int(((node.get("status") or {}).get("capacity") or {}).get(resource, 0))


def whole(node: Mapping[str, Any], resources: Mapping[str, int]) -> bool:
    """Whether the node's allocatable is `resources`' counts, for each one named."""
    return all(allocatable(node, r) == n for r, n in resources.items())


class NodeHistory:
    """The node's updates as the API sent them: (arrival time, node JSON)."""

    def __init__(self) -> None:
        import threading

        self.updates: list[tuple[float, dict[str, Any]]] = []
        self._changed = threading.Condition()

    def add(self, node: dict[str, Any]) -> None:
        with self._changed:
            self.updates.append((time.time(), node))
            self._changed.notify_all()

    def wait_for(
        self,
        predicate: Callable[[list[tuple[float, dict[str, Any]]]], bool],
        timeout: float = 60.0,
    ) -> list[tuple[float, dict[str, Any]]]:
        """The updates so far once `predicate` holds for them; TimeoutError after
        `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.updates), timeout):
                raise TimeoutError(f"the node's updates did not show it within {timeout:g} s")
            return list(self.updates)

    def allocatable_back(
        self, resources: Mapping[str, int], after: float, registered: float
    ) -> tuple[float, bool]:
        """When the API showed the node's allocatable whole again after `after` (a
        kubelet start, a plugin pod deleted): waits for the node's first update past
        `after`; if it, or a later one, showed less, the whole one that follows the last
        drop is the answer. With no drop the API never showed less, and the plugin's
        registration (`registered`) is when it was whole again. Returns the time and
        whether a drop was seen."""

        def settled(updates: list[tuple[float, dict[str, Any]]]) -> bool:
            later = [n for t, n in updates if t >= after]
            return bool(later) and whole(later[-1], resources)

        updates = [(t, n) for t, n in self.wait_for(settled) if t >= after]
        drops = [i for i, (_, n) in enumerate(updates) if not whole(n, resources)]
        if not drops:
            return registered, False
        return next(t for t, n in updates[drops[-1] + 1 :] if whole(n, resources)), True


class NodeApi:
    """Waits on API watches, DaemonSets and pods of one node; RealNode is one."""

    @property
    def api(self) -> Any:
        raise NotImplementedError

    @property
    def node_name(self) -> str:
        raise NotImplementedError

    def kubectl(
        self, *args: str, timeout: float = 60.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def wait_pod(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] = pod_ready,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """The pod, as JSON, once `predicate` holds (default: Ready)."""
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        return watch_until(
            self.api,
            core.list_namespaced_pod,
            predicate,
            timeout,
            namespace=namespace,
            field_selector=f"metadata.name={name}",
        )

    def wait_node(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0
    ) -> dict[str, Any]:
        """The node, as JSON, once `predicate` holds (see `allocatable`, `capacity`)."""
        from kubernetes import client

        return watch_until(
            self.api,
            client.CoreV1Api(self.api).list_node,
            predicate,
            timeout,
            field_selector=f"metadata.name={self.node_name}",
        )

    def wait_allocatable(self, wanted: Mapping[str, int], timeout: float = 60.0) -> dict[str, Any]:
        """The node once its allocatable equals `wanted` for each resource named."""
        return self.wait_node(
            lambda n: all(allocatable(n, r) == c for r, c in wanted.items()), timeout
        )

    @contextlib.contextmanager
    def node_history(self) -> Iterator[NodeHistory]:
        """Every update of the node from now on, recorded by a watch in a thread while
        the block runs: how the API saw a restart."""
        import threading

        from kubernetes import client, watch

        history = NodeHistory()
        core = client.CoreV1Api(self.api)
        version = self.node()["metadata"]["resourceVersion"]
        done = threading.Event()

        def follow() -> None:
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                for event in watcher.stream(
                    core.list_node,
                    field_selector=f"metadata.name={self.node_name}",
                    resource_version=version,
                    timeout_seconds=600,
                ):
                    history.add(self.api.sanitize_for_serialization(event["object"]))
                    if done.is_set():
                        return

        threading.Thread(target=follow, name="node history", daemon=True).start()
        try:
            yield history
        finally:
            done.set()  # the thread ends at its next event; nobody waits for it

    def node(self) -> dict[str, Any]:
        from kubernetes import client

        obj: dict[str, Any] = self.api.sanitize_for_serialization(
            client.CoreV1Api(self.api).read_node(self.node_name)
        )
        return obj

    # -- DaemonSets -------------------------------------------------------------

    def daemon_pods(self, namespace: str, daemonset: str) -> list[dict[str, Any]]:
        """The DaemonSet's pods that are not being deleted."""
        listed = self.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
        return [
            pod
            for pod in json.loads(listed)["items"]
            if not pod["metadata"].get("deletionTimestamp")
            and any(o["name"] == daemonset for o in pod["metadata"].get("ownerReferences") or [])
        ]

    def rolled_out(self, namespace: str, daemonset: str, timeout: float = ROLLOUT_S) -> str:
        """Wait until the DaemonSet's pod here is updated and Ready (`kubectl rollout
        status` watches it); its name."""
        self.kubectl(
            *("-n", namespace, "rollout", "status", f"ds/{daemonset}"),
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 30,
        )
        [pod] = self.daemon_pods(namespace, daemonset)
        return str(pod["metadata"]["name"])

    @contextlib.contextmanager
    def deployed(
        self, kustomization: Path, namespace: str, daemonset: str, timeout: float = ROLLOUT_S
    ) -> Iterator[str]:
        """`kubectl apply -k`, until its DaemonSet's pod is Ready (its name is
        yielded); everything it made is deleted afterwards, waited for."""
        self.kubectl("apply", "-k", str(kustomization))
        try:
            yield self.rolled_out(namespace, daemonset, timeout)
        finally:
            self.kubectl(
                *("delete", "-k", str(kustomization), "--wait=true", "--ignore-not-found"),
                f"--timeout={timeout:.0f}s",
                timeout=timeout + 30,
            )

    # -- pods -------------------------------------------------------------------

    @contextlib.contextmanager
    def namespace(self, prefix: str = "t") -> Iterator[str]:
        """A fresh namespace for one test; deleted afterwards, with its pods gone
        (waited for: their devices are free again for the next test)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl(
                "delete",
                "namespace",
                name,
                "--wait=true",
                "--timeout=120s",
                timeout=150,
                check=False,
            )

    def busybox_pod(
        self,
        name: str,
        resources: Mapping[str, int] | None = None,
        *,
        namespace: str,
        command: tuple[str, ...] = ("sleep", "3600"),
    ) -> dict[str, Any]:
        """A Pod manifest for this node: the node's busybox image (never pulled), host
        network (the node has no kube-proxy), stopped at once on deletion."""
        pod = pod_manifest(name, {"main": dict(resources or {})}, namespace=namespace)
        spec = pod["spec"]
        spec.update(hostNetwork=True, terminationGracePeriodSeconds=0)
        spec["containers"][0].update(image=BUSYBOX, imagePullPolicy="Never", command=list(command))
        return pod

    def create(self, manifest: Mapping[str, Any]) -> None:
        """Create one object from its manifest (`kubectl create -f -`)."""
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))
