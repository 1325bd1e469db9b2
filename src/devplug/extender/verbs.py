"""The kube-scheduler extender's verbs over the cluster's state: `filter`, `prioritize`
and `bind`, with the JSON shapes of k8s.io/kube-scheduler/extender/v1 (ExtenderArgs,
ExtenderFilterResult, HostPriorityList, ExtenderBindingArgs, ExtenderBindingResult).

With a cache (devplug.extender.cache, what `devplug extender` runs), each call reads
the state in memory that list and watch keep current; without one, each call reads
the cluster again through `Api`. Either way Nodes and pods are the only state, so a
restarted extender answers as the one before it. Binds are serialised: a bind sees
the shares its predecessor took (assumed in the cache at once, or its ASSIGNED
annotation read again), so two pods never get the same share.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from devplug.extender.cache import Cache
from devplug.extender.state import Cluster, NodeView, PodError, build, pod_demand, pod_needs
from devplug.placement import POLICY_NAMES, Demand, TargetWorkload, make_policy
from devplug.placement.inventory import ASSIGNED, ids, join
from devplug.placement.policies import Policy

MAX_PRIORITY = 10  # MaxExtenderPriority: an extender's scores are 0 to 10


class BadRequest(ValueError):
    """A request that is not what the verb takes; the message is one line."""


class NotReady(RuntimeError):
    """The cache has not listed the cluster yet: no answer would be right."""


class Api(Protocol):
    """What the extender reads and writes in the API server."""

    def nodes(self) -> list[dict[str, Any]]: ...

    def pods(self) -> list[dict[str, Any]]:
        """Every pod not Succeeded nor Failed."""
        ...

    def pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _string(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{key}: expected a non-empty string, got {value!r}")
    return value


class Extender:
    """Filters, ranks and binds with one placement policy (devplug.placement)."""

    def __init__(
        self,
        api: Api,
        policy: str = "default",
        target: TargetWorkload | None = None,
        cache: Cache | None = None,
    ) -> None:
        if policy not in POLICY_NAMES:
            raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICY_NAMES)}")
        self.api = api
        self.policy_name = policy
        self.target = target
        self.cache = cache
        self._bind_lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """Whether the verbs can answer: the cache (if any) has listed Nodes and pods."""
        return self.cache is None or self.cache.synced

    # -- state ---------------------------------------------------------------------

    def state(
        self, nodes: Sequence[dict[str, Any]] | None = None
    ) -> tuple[Cluster, list[dict[str, Any]]]:
        """The state now: `nodes` (the scheduler's candidates) or every Node, with every
        pod's placed shares taken; and the pods."""
        cache = self.cache
        if cache is not None:
            if not cache.synced:
                raise NotReady("the extender has not listed the cluster's Nodes and pods yet")
            cluster = cache.cluster()
            known = cluster.nodes.keys() | cluster.problems.keys()
            for obj in nodes or ():
                if (obj.get("metadata") or {}).get("name", "") not in known:
                    seen = cache.view_of(obj)  # newer than the cache's watch
                    cluster.nodes.update(seen.nodes)
                    cluster.problems.update(seen.problems)
                    cluster.owner.update(seen.owner)
            return cluster, cache.pods()
        pods = self.api.pods()
        return build(self.api.nodes() if nodes is None else nodes, pods), pods

    def _policy(self, cluster: Cluster, demand: Demand, pods: Sequence[dict[str, Any]]) -> Policy:
        nodes = [v.node for v in cluster.nodes.values()]
        target = self.target
        if self.policy_name == "fgd" and target is None:
            # No workload given: the kinds of the pods placed, and this one.
            kinds = [demand]
            for pod in pods:
                if ASSIGNED in ((pod.get("metadata") or {}).get("annotations") or {}):
                    owner = cluster.owner.get(ids(pod["metadata"]["annotations"][ASSIGNED])[0])
                    if owner in cluster.nodes:
                        with contextlib.suppress(PodError):
                            kinds.append(pod_demand(pod, cluster.nodes[owner].inventory))
            target = TargetWorkload.of(kinds)
        return make_policy(self.policy_name, nodes, target)

    # -- verbs ---------------------------------------------------------------------

    def _candidates(
        self, args: Any
    ) -> tuple[dict[str, Any], list[dict[str, Any]] | None, list[str]]:
        """ExtenderArgs: the pod, the candidate Node objects (nodeCacheCapable false) or
        None, and the candidates' names."""
        args = _object(args, "the request")
        pod = _object(args.get("Pod"), "Pod")
        listed = args.get("Nodes")
        names = args.get("NodeNames")
        if listed is not None:
            items = _object(listed, "Nodes").get("items") or []
            if not isinstance(items, list):
                raise BadRequest("Nodes.items: expected a list")
            nodes = [_object(n, "Nodes.items[]") for n in items]
            return pod, nodes, [str((n.get("metadata") or {}).get("name", "")) for n in nodes]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("the request has neither Nodes nor NodeNames (a list of names)")
        return pod, None, list(names)

    def _fits(
        self, pod: dict[str, Any], nodes: list[dict[str, Any]] | None, names: list[str]
    ) -> tuple[
        Cluster, dict[str, tuple[NodeView, Demand]], dict[str, str], dict[str, str], list[Any]
    ]:
        """Per candidate: fits (its view and the pod's demand there), fails (why), or
        cannot fit whatever is removed (why)."""
        cluster, pods = self.state(nodes)
        fits: dict[str, tuple[NodeView, Demand]] = {}
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        try:
            needs = pod_needs(pod)
        except PodError as error:
            raise BadRequest(str(error)) from None
        demands: dict[tuple[str, int], Demand | str] = {}  # per resource and unit
        for name in names:
            view = cluster.nodes.get(name)
            if view is None:
                unresolvable[name] = cluster.problems.get(name, f"node {name} is not known")
                continue
            key = (view.inventory.resource, view.inventory.unit)
            if key not in demands:
                try:
                    demands[key] = pod_demand(pod, view.inventory, needs)
                except PodError as error:
                    demands[key] = str(error)
            demand = demands[key]
            if isinstance(demand, str):
                unresolvable[name] = demand
                continue
            stage = view.node.stage(demand)
            if stage == 0:
                unresolvable[name] = "no GPU of a model the pod accepts"
            elif stage < 5:
                from devplug.placement.state import REASONS

                failed[name] = f"not enough free on one GPU ({REASONS[stage]})"
            else:
                fits[name] = (view, demand)
        return cluster, fits, failed, unresolvable, pods

    def filter(self, args: Any) -> dict[str, Any]:
        pod, nodes, names = self._candidates(args)
        _, fits, failed, unresolvable, _ = self._fits(pod, nodes, names)
        result: dict[str, Any] = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
        if nodes is not None:
            result["Nodes"] = {
                "metadata": {},
                "items": [n for n in nodes if (n.get("metadata") or {}).get("name") in fits],
            }
            result["NodeNames"] = None
        else:
            result["Nodes"] = None
            result["NodeNames"] = [n for n in names if n in fits]
        return result

    def scores(self, args: Any) -> dict[str, float]:
        """The policy's score of every candidate the pod fits."""
        pod, nodes, names = self._candidates(args)
        cluster, fits, _, _, pods = self._fits(pod, nodes, names)
        if not fits:
            return {}
        policy = self._policy(cluster, next(iter(fits.values()))[1], pods)
        return {name: policy.score(view.node, demand) for name, (view, demand) in fits.items()}

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """HostPriorityList: the policy's best node 10 (the first of equals in the
        candidates' order), the others 0 to 9 by their score between the worst and the
        best; nodes the pod does not fit 0."""
        names = self._candidates(args)[2]
        scores = self.scores(args)
        ranked = rank(scores, names)
        return [{"Host": name, "Score": ranked.get(name, 0)} for name in names]

    def bind(self, args: Any) -> dict[str, Any]:
        """Record the GPUs the policy chooses on the node on the pod (ASSIGNED), then
        bind it; ExtenderBindingResult with the one-line Error when it cannot."""
        args = _object(args, "the request")
        name, namespace = _string(args, "PodName"), _string(args, "PodNamespace")
        uid, node = _string(args, "PodUID"), _string(args, "Node")
        with self._bind_lock:
            known = self.cache.pod(namespace, name) if self.cache is not None else None
            if known is None or (known.get("metadata") or {}).get("uid") != uid:
                known = self.api.pod(namespace, name)  # newer than the cache's watch
            pod = known
            meta = pod.get("metadata") or {}
            if meta.get("uid") != uid:
                return {"Error": f"pod {namespace}/{name} has UID {meta.get('uid')}, not {uid}"}
            cluster, pods = self.state()
            view = cluster.nodes.get(node)
            if view is None:
                return {"Error": cluster.problems.get(node, f"node {node} is not known")}
            try:
                demand = pod_demand(pod, view.inventory)
            except PodError as error:
                return {"Error": str(error)}
            chosen = ids((meta.get("annotations") or {}).get(ASSIGNED, ""))
            if not chosen or any(cluster.owner.get(g) != node for g in chosen):
                if not view.node.fits(demand):
                    return {"Error": f"node {node} has no longer the GPU share pod {name} needs"}
                policy = self._policy(cluster, demand, pods)
                gpus = policy.gpus(view.node, demand)
                chosen = [view.inventory.gpus[i].id for i in gpus]
                self.api.annotate(namespace, name, {ASSIGNED: join(chosen)})
            if self.cache is not None:
                # Counted now, not when the watch brings the pod back: the next bind
                # sees this share taken.
                self.cache.assume(pod, node, chosen)
            self.api.bind(namespace, name, uid, node)
        return {"Error": ""}


def rank(scores: Mapping[str, float], order: Sequence[str]) -> dict[str, int]:
    """Scores scaled to the extender's 0-10: the best (first of equals in `order`) 10,
    the others at most 9, so that the extender's choice wins whatever its weight
    multiplies."""
    if not scores:
        return {}
    best = max(scores.values())
    worst = min(scores.values())
    first = next(n for n in order if scores.get(n) == best)
    span = best - worst
    ranked = {}
    for name, score in scores.items():
        if name == first:
            ranked[name] = MAX_PRIORITY
        elif span <= 0:
            ranked[name] = MAX_PRIORITY - 1
        else:
            ranked[name] = min(MAX_PRIORITY - 1, int((MAX_PRIORITY - 1) * (score - worst) / span))
    return ranked
