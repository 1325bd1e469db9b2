"""The extender's state in memory: Nodes and pods followed by list and watch
(devplug.apiserver.informer), the placement view of each node kept current as they
change, so a verb answers without reading the API server.

A pod the extender just bound is assumed, as the kube-scheduler's cache does: its
node and GPUs count at once, before the watch brings the pod back, so the next bind
never picks the same share. The watch confirms the assumption (the pod is seen with
the GPUs written, or bound) or drops it (the pod is deleted, or a list no longer has
it). Nothing else is kept: a restarted extender lists again and has the same state.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from devplug.apiserver.informer import WATCH_TIMEOUT_S
from devplug.extender.kubeapi import KINDS
from devplug.extender.state import Cluster, NodeView, build
from devplug.placement.inventory import ASSIGNED, ids, join

if TYPE_CHECKING:
    from devplug.apiserver.informer import Informer
    from devplug.extender.kubeapi import KubeApi

Pod = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _uid(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(pod)
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _assigned(pod: Mapping[str, Any]) -> str:
    notes = _meta(pod).get("annotations")
    return str(notes.get(ASSIGNED, "")) if isinstance(notes, Mapping) else ""


def _node_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class Cache:
    """Nodes and pods of the API server, and the placement view built from them."""

    def __init__(self, source: KubeApi | None, watch_timeout_s: int = WATCH_TIMEOUT_S) -> None:
        """`source`: the API server listed and watched (None: fed by hand)."""
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}  # name -> Node object
        self._pods: dict[str, Pod] = {}  # UID -> pod, as the watch last showed it
        self._assumed: dict[str, Pod] = {}  # UID -> pod as the extender bound it
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, name) -> UID
        self._placed: dict[str, str] = {}  # UID -> the node it counts on
        self._on_node: dict[str, dict[str, Pod]] = {}  # node -> UID -> pod
        self._unbound: set[str] = set()  # UIDs placed by their GPUs alone (not bound yet)
        self._cluster = Cluster()
        self._listed: set[str] = set()  # the kinds listed at least once
        self._changed = threading.Condition()  # notified after each change of the state
        self._source = source
        self.informers: dict[str, Informer] = {}
        if source is not None:
            for kind in KINDS:
                replace = functools.partial(self.replace, kind)
                apply = functools.partial(self.apply, kind)
                self.informers[kind] = source.informer(kind, replace, apply, watch_timeout_s)

    # -- life ----------------------------------------------------------------------

    def start(self) -> None:
        if self._source is not None:
            for informer in self.informers.values():
                self._source.start(informer)

    def stop(self) -> None:
        if self._source is not None:
            for informer in self.informers.values():
                self._source.stop(informer)

    @property
    def synced(self) -> bool:
        """Both kinds listed once: the cache holds the API server's state."""
        return self._listed >= set(KINDS)

    def wait_synced(self, timeout: float) -> bool:
        return self.wait_for(lambda: self.synced, timeout)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate` holds, checked after each change the watches bring;
        whether it did within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- the store the informers feed ----------------------------------------------

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        self._replace(kind, items)
        self._notify()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self._apply(kind, event, obj)
        self._notify()

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._listed.add(kind)
            if kind == "nodes":
                self._nodes = {str(_meta(n).get("name", "")): n for n in items}
                self._rebuild()
                return
            self._pods, self._uids = {}, {}
            for pod in items:
                self._pods[_uid(pod)] = pod
                self._uids[_key(pod)] = _uid(pod)
            # An assumed pod the list no longer has is gone; one it has still counts
            # until the pod is seen as the extender left it.
            self._assumed = {u: p for u, p in self._assumed.items() if u in self._pods}
            for uid in list(self._assumed):
                self._confirm(uid)
            self._rebuild()

    def _apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if kind == "nodes":
                name = str(_meta(obj).get("name", ""))
                if event == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = obj
                self._node_changed(name)
                return
            uid = _uid(obj)
            if event == "DELETED":
                self._pods.pop(uid, None)
                self._assumed.pop(uid, None)
                if self._uids.get(_key(obj)) == uid:
                    del self._uids[_key(obj)]
            else:
                self._pods[uid] = obj
                self._uids[_key(obj)] = uid
                self._confirm(uid)
            self._pod_changed(uid)

    def _confirm(self, uid: str) -> None:
        """Drop the assumption once the watch shows the pod bound or with the GPUs the
        extender wrote."""
        assumed, seen = self._assumed.get(uid), self._pods.get(uid)
        if assumed is None or seen is None:
            return
        if _node_name(seen) or (_assigned(seen) and _assigned(seen) == _assigned(assumed)):
            del self._assumed[uid]

    # -- the placement view --------------------------------------------------------

    def _pod(self, uid: str) -> Pod | None:
        return self._assumed.get(uid) or self._pods.get(uid)

    def _where(self, pod: Mapping[str, Any]) -> str:
        """The node a pod counts on: its spec.nodeName, or the node of its ASSIGNED
        GPUs while its binding is under way (as state.build reads it)."""
        assigned = ids(_assigned(pod))
        return _node_name(pod) or (self._cluster.owner.get(assigned[0], "") if assigned else "")

    def _rebuild(self) -> None:
        """Every node's view again (after a list)."""
        self._cluster = Cluster()
        for name, obj in self._nodes.items():
            self._view(name, obj)
        self._placed, self._on_node, self._unbound = {}, {}, set()
        for uid in set(self._pods) | set(self._assumed):
            self._place(uid)
        for name in self._nodes:
            self._refresh(name)

    def _view(self, name: str, obj: dict[str, Any]) -> None:
        """The node's published GPUs and problems, without its pods."""
        cluster = self._cluster
        old = cluster.nodes.pop(name, None)
        cluster.problems.pop(name, None)
        if old is not None:
            for published in old.inventory.gpus:
                if cluster.owner.get(published.id) == name:
                    del cluster.owner[published.id]
        alone = build([obj], ())
        cluster.problems.update(alone.problems)
        cluster.nodes.update(alone.nodes)
        cluster.owner.update(alone.owner)

    def _place(self, uid: str) -> str:
        """Count the pod on its node (taken off the one it was on); the old node."""
        old = self._placed.pop(uid, "")
        if old:
            self._on_node.get(old, {}).pop(uid, None)
        pod = self._pod(uid)
        where = self._where(pod) if pod is not None else ""
        self._unbound.discard(uid)
        if pod is not None and not _node_name(pod) and _assigned(pod):
            self._unbound.add(uid)
        if pod is not None and where:
            self._placed[uid] = where
            self._on_node.setdefault(where, {})[uid] = pod
        return old

    def _refresh(self, name: str) -> None:
        """The node's view with the pods that count on it."""
        obj = self._nodes.get(name)
        if obj is None:
            return
        view = build([obj], self._on_node.get(name, {}).values()).nodes.get(name)
        if view is not None:
            self._cluster.nodes[name] = view

    def _node_changed(self, name: str) -> None:
        obj = self._nodes.get(name)
        cluster = self._cluster
        if obj is None:
            old = cluster.nodes.pop(name, None)
            cluster.problems.pop(name, None)
            for published in old.inventory.gpus if old is not None else ():
                if cluster.owner.get(published.id) == name:
                    del cluster.owner[published.id]
        else:
            self._view(name, obj)
        # Pods placed only by their GPUs may now count on another node (or none).
        moved = {name}
        for uid in list(self._unbound):
            moved.add(self._place(uid))
            moved.add(self._placed.get(uid, ""))
        for node in moved - {""}:
            self._refresh(node)

    def _pod_changed(self, uid: str) -> None:
        old = self._place(uid)
        for node in {old, self._placed.get(uid, "")} - {""}:
            self._refresh(node)

    # -- what the verbs read -------------------------------------------------------

    def cluster(self) -> Cluster:
        """The state now; the verbs read it while the watches go on (views are
        replaced, never changed)."""
        with self._lock:
            cluster = self._cluster
            return Cluster(dict(cluster.nodes), dict(cluster.problems), dict(cluster.owner))

    def pods(self) -> list[Pod]:
        with self._lock:
            return [p for u in set(self._pods) | set(self._assumed) if (p := self._pod(u))]

    def pods_on(self, node: str) -> list[Pod]:
        with self._lock:
            return list(self._on_node.get(node, {}).values())

    def view_of(self, obj: dict[str, Any]) -> Cluster:
        """A node the watch has not brought yet (the scheduler's own watch was first):
        its view from the object given, with the pods that count on it."""
        return build([obj], self.pods_on(str(_meta(obj).get("name", ""))))

    def pod(self, namespace: str, name: str) -> Pod | None:
        with self._lock:
            uid = self._uids.get((namespace, name))
            return self._pod(uid) if uid is not None else None

    def assume(self, pod: Mapping[str, Any], node: str, gpus: Iterable[str]) -> None:
        """The pod as the extender just bound it: on `node`, with `gpus` (ASSIGNED)."""
        bound = copy.deepcopy(dict(pod))
        meta = bound.setdefault("metadata", {})
        meta.setdefault("annotations", {})[ASSIGNED] = join(list(gpus))
        bound.setdefault("spec", {})["nodeName"] = node
        uid = _uid(bound)
        with self._lock:
            self._assumed[uid] = bound
            self._uids[_key(bound)] = uid
            self._pod_changed(uid)
        self._notify()

    @property
    def assumed(self) -> int:
        """Pods bound by the extender that the watch has not shown as bound yet."""
        with self._lock:
            return len(self._assumed)

    def node_view(self, name: str) -> NodeView | None:
        with self._lock:
            return self._cluster.nodes.get(name)
