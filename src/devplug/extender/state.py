"""The extender's view of the cluster, rebuilt from the API server's objects alone: per
node, per GPU, the published inventory minus the shares of the pods already placed
(read from their ASSIGNED annotations), so a restart of the extender loses nothing.

Pure: Node and Pod objects (the API's JSON) in, devplug.placement nodes out.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devplug.kube.quantity import QuantityError, parse_quantity
from devplug.kube.requests import pod_requests
from devplug.placement.inventory import (
    ASSIGNED,
    INVENTORY,
    Inventory,
    InventoryError,
    decode,
    demand_of,
    ids,
)
from devplug.placement.state import MILLI, Demand, Node

MODELS = "devplug.io/gpu-models"  # on a pod: the GPU models it accepts, comma-separated
MIB = 2**20
DONE = ("Succeeded", "Failed")


class PodError(ValueError):
    """A pod whose request the extender cannot place (one line)."""


@dataclass(slots=True)
class NodeView:
    """One node: its published GPUs and the placement state built from them."""

    name: str
    inventory: Inventory
    node: Node
    problem: str = ""  # why no pod of shares may go here (a bad inventory); empty: fine

    def gpu_index(self, gpu_id: str) -> int:
        return next(i for i, g in enumerate(self.inventory.gpus) if g.id == gpu_id)


@dataclass(slots=True)
class Cluster:
    """The nodes the extender knows, by name, and which node holds which GPU."""

    nodes: dict[str, NodeView] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # node name -> why not usable
    owner: dict[str, str] = field(default_factory=dict)  # GPU ID -> node name


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    notes = _meta(obj).get("annotations")
    return notes if isinstance(notes, Mapping) else {}


def _amount(value: Any, scale: int, where: str) -> int:
    try:
        return math.ceil(parse_quantity(value) * scale)
    except QuantityError as error:
        raise PodError(f"{where}: {error}") from None


def container_needs(container: Mapping[str, Any], where: str) -> dict[str, int]:
    """CPU (millicores), memory (MiB) and extended resources (counts) one container asks
    for: its requests, its limits where a request is not given."""
    resources = container.get("resources") or {}
    asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    needs: dict[str, int] = {}
    for name, value in asked.items():
        at = f"{where}.resources[{name}]"
        if name == "cpu":
            needs[name] = _amount(value, 1000, at)
        elif name == "memory":
            needs[name] = math.ceil(_amount(value, 1, at) / MIB)
        elif "/" in name:
            needs[name] = _amount(value, 1, at)
    return needs


def pod_needs(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's requests as the scheduler sums them (devplug.kube.requests)."""
    spec = pod.get("spec") or {}
    name = _meta(pod).get("name", "?")
    containers = [
        container_needs(c, f"pod {name}: {c.get('name', '?')}")
        for c in spec.get("containers") or []
    ]
    inits = [
        (
            container_needs(c, f"pod {name}: {c.get('name', '?')}"),
            c.get("restartPolicy") == "Always",
        )
        for c in spec.get("initContainers") or []
    ]
    return pod_requests(containers, inits)


def pod_demand(
    pod: Mapping[str, Any], inventory: Inventory, needs: Mapping[str, int] | None = None
) -> Demand:
    """What the pod asks of a node publishing `inventory`: its shares as milli-GPUs,
    its CPU and memory, the GPU models it accepts (annotation MODELS); `needs`: the
    pod's `pod_needs`, when already known."""
    needs = pod_needs(pod) if needs is None else needs
    models = frozenset(m.strip() for m in _annotations(pod).get(MODELS, "").split(",") if m.strip())
    milli = inventory.milli_of(needs.get(inventory.resource, 0))
    try:
        return demand_of(milli, models, needs.get("cpu", 0), needs.get("memory", 0))
    except ValueError as error:
        raise PodError(f"pod {_meta(pod).get('name', '?')}: {error}") from None


def asks_shares(pod: Mapping[str, Any], resources: Iterable[str]) -> bool:
    needs = pod_needs(pod)
    return any(needs.get(r, 0) for r in resources)


@functools.lru_cache(maxsize=8192)
def _inventory(text: str, name: str) -> Inventory | str:
    """A node's inventory read once per text (every call reads every Node again)."""
    try:
        return decode(text, f"node {name}: {INVENTORY}")
    except InventoryError as error:
        return str(error)


@functools.lru_cache(maxsize=8192)
def _sizes(cpu: str, memory: str, name: str) -> tuple[int, int] | str:
    """A node's allocatable CPU (millicores) and memory (MiB), parsed once per value."""
    try:
        return (
            _amount(cpu, 1000, f"node {name}: allocatable.cpu"),
            math.ceil(_amount(memory, 1, f"node {name}: allocatable.memory") / MIB),
        )
    except PodError as error:
        return str(error)


def node_view(obj: Mapping[str, Any]) -> NodeView | str:
    """A Node object as the extender sees it, or why it cannot be used."""
    name = str(_meta(obj).get("name", ""))
    text = _annotations(obj).get(INVENTORY)
    if text is None:
        return f"node {name} publishes no GPU inventory ({INVENTORY})"
    inventory = _inventory(text, name)
    if isinstance(inventory, str):
        return inventory
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    sizes = _sizes(str(allocatable.get("cpu", 0)), str(allocatable.get("memory", 0)), name)
    if isinstance(sizes, str):
        return sizes
    cpu, memory = sizes
    free = [g.milli if g.healthy and not g.mig else 0 for g in inventory.gpus]
    model = inventory.gpus[0].model if inventory.gpus else ""
    links = [g.nvlink for g in inventory.gpus]
    numa = [g.numa for g in inventory.gpus]
    node = Node(name, cpu, memory, model, free, gpu_link=links, gpu_numa=numa)
    return NodeView(name, inventory, node)


def build(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Cluster:
    """The cluster from its Node objects and its pods: each pod placed on a node (its
    spec.nodeName, or the node of its ASSIGNED GPUs while its binding is under way)
    takes its CPU and memory there, and its share of each GPU it was assigned."""
    cluster = Cluster()
    for obj in nodes:
        seen = node_view(obj)
        name = str(_meta(obj).get("name", ""))
        if isinstance(seen, str):
            cluster.problems[name] = seen
            continue
        cluster.nodes[name] = seen
        for published in seen.inventory.gpus:
            cluster.owner[published.id] = name
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in DONE:
            continue
        assigned = ids(_annotations(pod).get(ASSIGNED, ""))
        where = (pod.get("spec") or {}).get("nodeName") or (
            cluster.owner.get(assigned[0]) if assigned else None
        )
        view = cluster.nodes.get(where or "")
        if view is None:
            continue
        try:
            needs = pod_needs(pod)
        except PodError:
            continue  # the API server accepted it; a quantity this reader refuses counts as 0
        node = view.node
        node.cpu_free -= needs.get("cpu", 0)
        node.memory_free -= needs.get("memory", 0)
        milli = view.inventory.milli_of(needs.get(view.inventory.resource, 0))
        on_node = [g for g in assigned if cluster.owner.get(g) == view.name]
        per_gpu = min(milli, MILLI) if on_node else 0
        for gpu in on_node:
            index = view.gpu_index(gpu)
            node.gpu_free[index] = max(0, node.gpu_free[index] - per_gpu)
    return cluster
