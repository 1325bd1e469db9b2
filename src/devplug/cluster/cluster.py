"""N simulated nodes behind a scheduler step: place pods, admit them, report where.

    async with Cluster("devices.yaml", nodes=3) as cluster:
        for placement in await cluster.place(parse_pods(text)):
            print(placement.pod, placement.node, placement.status, placement.message)

Pods are placed one at a time, in order: the scheduler step picks a node (or finds
none), then that node's kubelet simulator admits the pod. A pod the kubelet rejects
is not placed elsewhere (a real kubelet marks it Failed) and holds nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec

from devplug.cluster.nodes import SimNode
from devplug.cluster.scheduler import NodeState, effective_requests, schedule
from devplug.simulator import REASON_ALREADY_EXISTS, REASON_INVALID, ContainerResult
from devplug.simulator.pods import InvalidPod, PodSpec

ADMITTED = "Admitted"  # scheduled, and admitted by the node's kubelet
REJECTED = "Rejected"  # scheduled, and rejected by the node's kubelet
UNSCHEDULABLE = "Unschedulable"  # no node fits
REFUSED = "Refused"  # refused before scheduling, as the API server would
REASON_UNSCHEDULABLE = "Unschedulable"
DEFAULT_TIMEOUT_S = 30.0


class Placement(msgspec.Struct, frozen=True):
    """What happened to one pod."""

    pod: str
    namespace: str
    uid: str
    # ADMITTED, REJECTED, UNSCHEDULABLE or REFUSED
    status: str
    # the node the scheduler picked (None when unschedulable or refused)
    node: str | None = None
    # the kubelet's reason (REJECTED), Unschedulable, Invalid or AlreadyExists
    reason: str = ""
    message: str = ""
    # the pod's effective extended resource requests
    requests: dict[str, int] = msgspec.field(default_factory=dict)
    # least-allocated score of each node that fits
    scores: dict[str, int] = msgspec.field(default_factory=dict)
    # why each other node does not fit
    unfit: dict[str, list[str]] = msgspec.field(default_factory=dict)
    containers: list[ContainerResult] = msgspec.field(default_factory=list)


class ResourceSummary(msgspec.Struct, frozen=True):
    name: str
    capacity: int
    allocatable: int
    # devices the kubelet allocated / extended resources the scheduler counted
    allocated: int
    requested: int


class NodeSummary(msgspec.Struct, frozen=True):
    node: str
    resources: list[ResourceSummary]
    pods: list[str]  # namespace/name


class Cluster:
    """`nodes` simulated nodes (`node-1` ... `node-N`), each a kubelet simulator with its
    own `devplug serve --config CONFIG` process, in a temporary folder (`root`, default
    a new one, removed by `stop()`)."""

    def __init__(
        self,
        config: Path | str,
        nodes: int,
        *,
        resources: Sequence[str] = (),
        topology_policy: str = "none",
        numa_nodes: int | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        serve_log_level: str = "warning",
        root: Path | str | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.config = Path(config).resolve()
        self.node_count = nodes
        # The resources every node must register before pods are placed (default: the
        # config's).
        self.resources = list(resources)
        self.topology_policy = topology_policy
        self.numa_nodes = numa_nodes
        self.timeout = timeout
        self.serve_log_level = serve_log_level
        self._own_root = root is None
        self._root = Path(root) if root is not None else None
        self.nodes: list[SimNode] = []
        self._states: dict[str, NodeState] = {}
        self._pods: dict[tuple[str, str], str] = {}  # (namespace, name) -> node

    @property
    def root(self) -> Path | None:
        return self._root

    async def start(self) -> None:
        """Start every node and wait until each has registered all the resources."""
        if not self.resources:
            from devplug.sources import load_config

            self.resources = [r.name for r in load_config(self.config).resources]
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="devplug-cluster-"))
        for index in range(1, self.node_count + 1):
            name = f"node-{index}"
            self.nodes.append(
                SimNode(
                    name,
                    self._root / name,
                    self.config,
                    topology_policy=self.topology_policy,
                    numa_nodes=self.numa_nodes,
                    serve_log_level=self.serve_log_level,
                )
            )
        for node in self.nodes:
            await node.start()
        await asyncio.gather(*(n.wait_ready(self.resources, self.timeout) for n in self.nodes))
        self._states = {n.name: NodeState(n.name, n.allocatable()) for n in self.nodes}

    async def stop(self) -> None:
        """Stop every node and its plugin process; remove the folder if it made it."""
        try:
            results = await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        finally:
            self.kill_now()

    def kill_now(self) -> None:
        """Synchronous last resort (the loop may be gone): kill what still runs and
        remove the folder. Safe to call more than once."""
        for node in self.nodes:
            node.kill_now()
        if self._own_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- placing pods ------------------------------------------------------------------

    async def place(self, pods: Sequence[PodSpec | InvalidPod]) -> list[Placement]:
        """Schedule and admit `pods` one at a time, in order."""
        return [await self.place_one(pod) for pod in pods]

    async def place_one(self, pod: PodSpec | InvalidPod) -> Placement:
        if isinstance(pod, InvalidPod):
            return Placement(
                pod.name, pod.namespace, "", REFUSED, None, REASON_INVALID, pod.message
            )
        if pod.key in self._pods:
            message = f'pods "{pod.name}" already exists'
            return Placement(
                pod.name, pod.namespace, pod.uid, REFUSED, None, REASON_ALREADY_EXISTS, message
            )
        requests = effective_requests(pod)
        nodes = [self._refreshed(n) for n in self.nodes]
        decision = schedule(requests, nodes)
        common: dict[str, Any] = {
            "requests": decision.requests,
            "scores": decision.scores,
            "unfit": decision.unfit,
        }
        if decision.node is None:
            return Placement(
                pod.name,
                pod.namespace,
                pod.uid,
                UNSCHEDULABLE,
                None,
                REASON_UNSCHEDULABLE,
                decision.message,
                **common,
            )
        node = next(n for n in self.nodes if n.name == decision.node)
        [result] = await node.kubelet.apply(_with_uid(pod))
        if not result.admitted:
            return Placement(
                pod.name,
                pod.namespace,
                pod.uid,
                REJECTED,
                node.name,
                result.reason,
                result.message,
                **common,
            )
        self._states[node.name].place(requests)
        self._pods[pod.key] = node.name
        return Placement(
            pod.name,
            pod.namespace,
            pod.uid,
            ADMITTED,
            node.name,
            containers=result.containers,
            **common,
        )

    def _refreshed(self, node: SimNode) -> NodeState:
        """The scheduler's view of `node`: the allocatable counts it reports now, and the
        requests of the pods placed there."""
        state = self._states.setdefault(node.name, NodeState(node.name, {}))
        state.allocatable = node.allocatable()
        return state

    def summaries(self) -> list[NodeSummary]:
        """Per node: each resource's capacity, allocatable, allocated and requested
        counts, and its pods."""
        summaries = []
        for node in self.nodes:
            status = node.kubelet.node_status()
            requested = self._states.get(node.name, NodeState(node.name, {})).requested
            resources = [
                ResourceSummary(
                    r.name, r.capacity, r.allocatable, r.allocated, requested.get(r.name, 0)
                )
                for r in status.resources
            ]
            pods = [f"{p.namespace}/{p.name}" for p in status.pods]
            summaries.append(NodeSummary(node.name, resources, pods))
        return summaries


def _with_uid(pod: PodSpec) -> dict[str, Any]:
    """The pod's manifest with its UID, so that the node reports the same one."""
    manifest = dict(pod.manifest)
    metadata = dict(manifest.get("metadata") or {})
    metadata["uid"] = pod.uid
    manifest["metadata"] = metadata
    return manifest
