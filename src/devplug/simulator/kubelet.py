"""The simulated kubelet: the device-plugin side of a node, as a library.

    async with Kubelet(plugin_dir, state_dir, topology_policy="single-numa-node",
                       numa_nodes=2) as kubelet:
        await kubelet.wait_for_resource("example.com/gpu", count=4)
        for pod in await kubelet.apply(manifest_yaml):
            print(pod.admitted, pod.reason, [c.options for c in pod.containers])
        await kubelet.delete_pod("train")
        seen = kubelet.registrations("example.com/gpu")
        await kubelet.restart()
        await kubelet.wait_for_registration("example.com/gpu", after=seen)

Files: `<plugin-dir>/kubelet.sock` (Registration), `<state-dir>/kubelet_internal_checkpoint`,
`<state-dir>/pod-resources/kubelet.sock` (PodResources v1), `<state-dir>/control.sock`
(the control socket of the `devplug` commands) and `<state-dir>/simulator_pods.json`
(the pods the node runs: the simulator's stand-in for the API server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from devplug.api.constants import (
    CHECKPOINT_FILE,
    ENDPOINT_GRACE_PERIOD_S,
    KUBELET_SOCKET,
    REGISTER_DIAL_TIMEOUT_S,
)
from devplug.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.ground.unixserver import UnixServer
from devplug.simulator import topology
from devplug.simulator.admission import admit
from devplug.simulator.containermanager import ContainerManager
from devplug.simulator.containers import restored_result
from devplug.simulator.events import (
    POD_DELETED,
    RESTARTED,
    EventLog,
    Recorder,
)
from devplug.simulator.manager import DeviceManager
from devplug.simulator.nodestatus import node_status, resource_ready, resource_status
from devplug.simulator.plugindir import (
    leave_dead_socket,
    refuse_beside_a_kubelet,
)
from devplug.simulator.podmanager import PodManager
from devplug.simulator.podresources import PodResourcesServicer
from devplug.simulator.pods import parse_pods
from devplug.simulator.results import (
    NodeStatus,
    PodResult,
    PodSummary,
    ResourceStatus,
)

if TYPE_CHECKING:
    from devplug.framework.dra.claims import ClaimSource
    from devplug.simulator.dra import DraManager, NodeSlices

log = logging.getLogger("devplug.simulator.kubelet")

POD_RESOURCES_SOCKET = Path("pod-resources") / KUBELET_SOCKET
CONTROL_SOCKET = "control.sock"
PODS_FILE = "simulator_pods.json"

__all__ = ["CONTROL_SOCKET", "PODS_FILE", "POD_RESOURCES_SOCKET", "Kubelet", "leave_dead_socket"]


def _numa_list(numa_nodes: int | Sequence[int] | None) -> list[int] | None:
    if numa_nodes is None:
        return None
    if isinstance(numa_nodes, int):
        if numa_nodes < 1:
            raise ValueError("numa_nodes must be at least 1")
        return list(range(numa_nodes))
    return sorted(set(numa_nodes))


def _checked_settings(
    topology_policy: str,
    numa_nodes: int | Sequence[int] | None,
    grace_period: float,
    dial_timeout: float,
) -> list[int] | None:
    """The node's NUMA node IDs (None: those the devices report); ValueError names a
    setting the kubelet would not start with."""
    if topology_policy not in topology.POLICIES:
        choices = ", ".join(topology.POLICIES)
        raise ValueError(f"unknown topology policy {topology_policy!r}: one of {choices}")
    numa = _numa_list(numa_nodes)
    if (
        numa is not None
        and topology_policy != topology.POLICY_NONE
        and len(numa) > topology.MAX_NUMA_NODES
    ):
        raise ValueError(
            f"the topology manager supports at most {topology.MAX_NUMA_NODES} NUMA nodes"
        )
    if grace_period < 0 or dial_timeout <= 0:
        raise ValueError("grace_period must be >= 0 and dial_timeout > 0")
    return numa


class Kubelet(Recorder):
    """A kubelet's device manager, topology manager, PodResources API and pod admission,
    driven by plugins on real sockets and by pod manifests.

    `plugin_dir` has no default: the simulator never takes the real kubelet's folder
    unasked, and refuses to start where a kubelet (or another simulator) answers.
    `state_dir` defaults to the parent of `plugin_dir`. `numa_nodes` is the node's NUMA
    node count (or their IDs); by default the nodes the devices report. `grace_period`
    is how long a resource whose plugin went away stays (unhealthy); `dial_timeout` how
    long Register waits to reach the plugin.
    `control_socket=False` serves no control socket.
    """

    def __init__(
        self,
        plugin_dir: Path | str,
        state_dir: Path | str | None = None,
        *,
        topology_policy: str = topology.POLICY_NONE,
        numa_nodes: int | Sequence[int] | None = None,
        grace_period: float = ENDPOINT_GRACE_PERIOD_S,
        dial_timeout: float = REGISTER_DIAL_TIMEOUT_S,
        control_socket: Path | str | bool | None = None,
        dra_registry_dir: Path | str | None = None,
        claims: ClaimSource | None = None,
        node_slices: NodeSlices | None = None,
    ) -> None:
        numa = _checked_settings(topology_policy, numa_nodes, grace_period, dial_timeout)
        self.plugin_dir = Path(plugin_dir)
        self.state_dir = Path(state_dir) if state_dir is not None else self.plugin_dir.parent
        self.topology_policy = topology_policy
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        self.registration_socket = self.plugin_dir / KUBELET_SOCKET
        self.checkpoint_path = self.state_dir / CHECKPOINT_FILE
        self.pod_resources_socket = self.state_dir / POD_RESOURCES_SOCKET
        self.pods_path = self.state_dir / PODS_FILE
        self.control_socket: Path | None
        if control_socket is False:
            self.control_socket = None
        elif control_socket is None or control_socket is True:
            self.control_socket = self.state_dir / CONTROL_SOCKET
        else:
            self.control_socket = Path(control_socket)
        # Why the checkpoint could not be used at the last start, if it could not.
        self.checkpoint_problem: str | None = None
        # DRA: the plugin watcher's folder and where claims are read (both or neither).
        if (dra_registry_dir is None) != (claims is None):
            raise ValueError("DRA needs both dra_registry_dir and claims")
        self.dra_registry_dir = Path(dra_registry_dir) if dra_registry_dir is not None else None
        self._cm = ContainerManager(
            plugin_dir=self.plugin_dir,
            state_dir=self.state_dir,
            checkpoint_path=self.checkpoint_path,
            registration_socket=self.registration_socket,
            topology_policy=topology_policy,
            numa_nodes=numa,
            grace_period=grace_period,
            dial_timeout=dial_timeout,
            emit=lambda kind, resource, detail: self._emit(kind, resource=resource, detail=detail),
            dra_registry_dir=self.dra_registry_dir,
            claims=claims,
            node_slices=node_slices,
        )
        self._registrar = self._cm.registrar
        self._pods = PodManager(self.pods_path)
        self._admit_lock = asyncio.Lock()
        self._log = EventLog()
        self._pod_resources_server: UnixServer | None = None
        self._control: Any = None
        self._running = False

    @property
    def dra(self) -> DraManager | None:
        """The DRA manager while the node runs with DRA."""
        return self._cm.dra

    @property
    def _manager(self) -> DeviceManager | None:
        return self._cm.devices

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Kubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._running

    def sockets(self) -> list[Path]:
        """The unix sockets it serves (a path past the unix limit fails at start)."""
        found = [self.registration_socket, self.pod_resources_socket]
        return found + ([self.control_socket] if self.control_socket is not None else [])

    async def start(self) -> None:
        """Start as the kubelet does: restore the checkpoint, clean the plugin folder,
        serve Registration, PodResources (and the control socket)."""
        if self._running:
            return
        refuse_beside_a_kubelet(
            (self.registration_socket, self.pod_resources_socket, self.control_socket)
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._pods.load()
        await self._start_node()
        if self.control_socket is not None:
            from devplug.simulator.control import ControlServer

            control = ControlServer(self, self.control_socket)
            try:
                await control.start()
            except BaseException:
                await self._stop_node()  # a half-started kubelet serves nothing
                raise
            self._control = control
        self._running = True
        log.info(
            "kubelet simulator serving %s (topology policy %s)",
            self.registration_socket,
            self.topology_policy,
        )

    async def stop(self) -> None:
        """Stop serving; the checkpoint and the pod list stay on disk."""
        if not self._running:
            return
        self._running = False
        if self._control is not None:
            await self._control.stop()
            self._control = None
        await self._stop_node()
        log.info("kubelet simulator stopped")

    async def restart(
        self, kill: bool = False, between: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """What a kubelet restart does to plugins: every socket in the plugin folder is
        removed and kubelet.sock is served anew; allocations come back from the
        checkpoint, and plugins must register again.

        `kill`: as after a SIGKILL, the old kubelet.sock stays behind, refusing
        connections, until the next kubelet's start-up wipe removes it with the
        plugins' sockets (a stopped kubelet removes it itself). `between` runs once the
        old kubelet has gone and before the new one starts."""
        self._require_running()
        async with self._admit_lock:
            await self._stop_node()
            if kill:
                leave_dead_socket(self.registration_socket)
            if between is not None:
                await between()
            await self._start_node()
        self._emit(RESTARTED)

    async def _start_node(self) -> None:
        manager, self.checkpoint_problem = self._cm.restore(p.spec.uid for p in self._pods)
        for entry in self._pods:
            if entry.result.admitted and not entry.result.containers:
                cdi = self.dra.container_cdi(entry.spec) if self.dra is not None else {}
                entry.result = restored_result(manager, entry.spec, cdi)
        keep = {self.checkpoint_path, self.pod_resources_socket}
        if self.control_socket is not None:
            keep.add(self.control_socket)
        await self._cm.serve_registration(keep)
        self._pod_resources_server = UnixServer(
            self.pod_resources_socket,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesServicer(self._pods, self._cm), server
            ),
        )
        await self._pod_resources_server.start()
        await self._cm.start_dra()

    async def _stop_node(self) -> None:
        await self._cm.stop()
        if self._pod_resources_server is not None:
            await self._pod_resources_server.stop(grace=0.5)
            self._pod_resources_server = None

    def _require_running(self) -> DeviceManager:
        if not self._running or self._manager is None:
            raise RuntimeError("the kubelet simulator is not running")
        return self._manager

    # -- waits (on the events an EventLog keeps; the rest of its API is the Recorder's) --

    async def wait_for_resource(
        self,
        name: str,
        *,
        count: int | None = None,
        capacity: int | None = None,
        timeout: float = 10.0,
    ) -> ResourceStatus:
        """Wait until the plugin for `name` is registered and has listed its devices,
        with `count` allocatable (healthy) devices and `capacity` devices if given."""

        want = "".join(
            f", {k} {v}" for k, v in (("count", count), ("capacity", capacity)) if v is not None
        )
        await self.wait_for(
            lambda: resource_ready(self.resource_status(name), count, capacity),
            timeout,
            f"resource {name}{want}",
        )
        status = self.resource_status(name)
        assert status is not None
        return status

    def registrations(self, resource: str) -> int:
        """Successful registrations of `resource` since this object was made."""
        return self._registrar.done[resource]

    async def wait_for_registration(
        self, resource: str, *, after: int = 0, timeout: float = 10.0
    ) -> int:
        """Wait until `resource` has registered more than `after` times; the count."""
        await self.wait_for(
            lambda: self._registrar.done[resource] > after,
            timeout,
            f"registration {after + 1} of {resource}",
        )
        return self._registrar.done[resource]

    # -- pods -------------------------------------------------------------------------

    async def apply(
        self, manifests: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> list[PodResult]:
        """Admit the pods of `manifests` (YAML text, or manifest dicts), in order.

        Each result says whether the pod was admitted; if so, per container its devices
        and runtime options; if not, the kubelet's reason and message. A rejected pod
        holds no devices and is not kept. Raises ManifestError for input that is not
        pod YAML.
        """
        self._require_running()
        parsed = parse_pods(manifests)
        results = []
        async with self._admit_lock:
            for item in parsed:
                manager = self._require_running()
                results.append(await admit(item, manager, self.dra, self._pods, self._pod_event))
        return results

    def _pod_event(self, kind: str, pod: str, detail: str) -> None:
        self._emit(kind, pod=pod, detail=detail)

    async def delete_pod(self, name: str, namespace: str = "default") -> bool:
        """Delete a pod and free its devices; False when there is no such pod."""
        manager = self._require_running()
        async with self._admit_lock:
            entry = self._pods.pop(namespace, name)
            if entry is None:
                return False
            manager.remove_pod(entry.spec.uid)
            if self.dra is not None:
                await self.dra.unprepare_pod(entry.spec)
        log.info("pod %s/%s deleted", namespace, name)
        self._emit(POD_DELETED, pod=f"{namespace}/{name}")
        return True

    def pods(self) -> list[PodSummary]:
        return [
            PodSummary(p.spec.name, p.spec.namespace, p.spec.uid, p.result.containers)
            for p in self._pods
        ]

    def pod(self, name: str, namespace: str = "default") -> PodResult | None:
        entry = self._pods.get(namespace, name)
        return entry.result if entry is not None else None

    # -- status ------------------------------------------------------------------------------

    def resource_status(self, name: str) -> ResourceStatus | None:
        return resource_status(self._manager, self._pods, name)

    def node_status(self) -> NodeStatus:
        return node_status(self._cm, self._pods, self.pods(), self.checkpoint_problem)

    def metrics_text(self) -> str:
        """The device-plugin metrics in Prometheus text format."""
        from devplug.simulator.report import metrics_text

        return metrics_text(self.node_status())
