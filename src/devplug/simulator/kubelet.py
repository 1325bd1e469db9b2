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
import collections
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from devplug.api.constants import (
    CHECKPOINT_FILE,
    ENDPOINT_GRACE_PERIOD_S,
    KUBELET_SOCKET,
    REGISTER_DIAL_TIMEOUT_S,
)
from devplug.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.files import keep_aside
from devplug.ground.unixserver import SocketPathTaken, UnixServer, socket_holder
from devplug.simulator import topology
from devplug.simulator.endpoint import EndpointError
from devplug.simulator.events import (
    POD_ADMITTED,
    POD_DELETED,
    POD_REJECTED,
    REGISTERED,
    REGISTRATION_REFUSED,
    RESTARTED,
    EventLog,
    KubeletEvent,
    Listener,
)
from devplug.simulator.manager import (
    AdmissionError,
    Allocation,
    DeviceInfo,
    DeviceManager,
    Histogram,
)
from devplug.simulator.podlist import PodList
from devplug.simulator.podresources import PodResourcesServicer
from devplug.simulator.pods import InvalidPod, PodSpec, parse_pod, parse_pods
from devplug.simulator.registration import (
    RegistrationRefused,
    RegistrationServicer,
    request_problem,
)
from devplug.simulator.results import (
    CREATE_CONTAINER_CONFIG_ERROR,
    REASON_ALREADY_EXISTS,
    REASON_INVALID,
    STARTED,
    WAITING,
    ContainerResult,
    DeviceStatus,
    NodeStatus,
    PodResult,
    PodSummary,
    ResourceStatus,
    RuntimeOptions,
)

if TYPE_CHECKING:
    from devplug.framework.dra.claims import ClaimSource
    from devplug.simulator.dra import DraManager, NodeSlices

log = logging.getLogger("devplug.simulator.kubelet")

POD_RESOURCES_SOCKET = Path("pod-resources") / KUBELET_SOCKET
CONTROL_SOCKET = "control.sock"
PODS_FILE = "simulator_pods.json"


@dataclass(slots=True)
class _Pod:
    spec: PodSpec
    result: PodResult


def _numa_list(numa_nodes: int | Sequence[int] | None) -> list[int] | None:
    if numa_nodes is None:
        return None
    if isinstance(numa_nodes, int):
        if numa_nodes < 1:
            raise ValueError("numa_nodes must be at least 1")
        return list(range(numa_nodes))
    return sorted(set(numa_nodes))


class Kubelet:
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
        self.plugin_dir = Path(plugin_dir)
        self.state_dir = Path(state_dir) if state_dir is not None else self.plugin_dir.parent
        self.topology_policy = topology_policy
        self._numa_nodes = numa
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
        self._claims = claims
        # With an API server: the node's ResourceSlices, wiped at start as the kubelet does.
        self._node_slices = node_slices
        self.dra: DraManager | None = None

        self._manager: DeviceManager | None = None
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._uids: set[str] = set()  # the UIDs of `_pods`
        self._pod_list = PodList(self.pods_path)
        self._registration_total: collections.Counter[str] = collections.Counter()
        self._registrations: collections.Counter[str] = collections.Counter()
        self._alloc_durations: dict[str, Histogram] = {}
        self._register_locks: dict[str, asyncio.Lock] = {}
        # The plugin sockets that registered with this simulator: what a restart removes.
        self._plugin_sockets: set[Path] = set()
        self._admit_lock = asyncio.Lock()
        self._log = EventLog()
        self._registration_server: UnixServer | None = None
        self._pod_resources_server: UnixServer | None = None
        self._control: Any = None
        self._running = False

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
        self._refuse_beside_a_kubelet()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._load_pods()
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
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        manager = DeviceManager(
            self.checkpoint_path,
            policy=self.topology_policy,
            numa_nodes=self._numa_nodes,
            grace_period=self.grace_period,
            dial_timeout=self.dial_timeout,
            on_event=self._manager_event,
            alloc_durations=self._alloc_durations,
        )
        self.checkpoint_problem = manager.restore(p.spec.uid for p in self._pods.values())
        if self.checkpoint_problem and self.checkpoint_path.is_file():
            self.checkpoint_problem += f"; kept as {self._keep_aside(self.checkpoint_path)}"
        self._manager = manager
        for entry in self._pods.values():
            if entry.result.admitted and not entry.result.containers:
                entry.result = self._restored_result(entry.spec)
        self._cleanup_plugin_dir()
        self._registration_server = UnixServer(
            self.registration_socket,
            lambda server: pb_grpc.add_RegistrationServicer_to_server(
                RegistrationServicer(self._register), server
            ),
        )
        await self._registration_server.start()
        self._pod_resources_server = UnixServer(
            self.pod_resources_socket,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesServicer(self), server
            ),
        )
        await self._pod_resources_server.start()
        if self.dra_registry_dir is not None and self._claims is not None:
            from devplug.simulator.dra import DraManager

            self.dra = DraManager(
                self.dra_registry_dir,
                self.state_dir,
                self._claims,
                on_event=self._dra_event,
                slices=self._node_slices,
            )
            await self.dra.start()

    def _dra_event(self, kind: str, driver: str, detail: str) -> None:
        from devplug.simulator.dra import DRIVER_REGISTERED

        if kind == DRIVER_REGISTERED:
            self._registrations[driver] += 1
        self._emit(kind, resource=driver, detail=detail)

    async def _stop_node(self) -> None:
        if self.dra is not None:
            await self.dra.stop()
            self.dra = None
        if self._registration_server is not None:
            await self._registration_server.stop(grace=0)
            self._registration_server = None
        if self._manager is not None:
            await self._manager.close()
        if self._pod_resources_server is not None:
            await self._pod_resources_server.stop(grace=0.5)
            self._pod_resources_server = None

    def _refuse_beside_a_kubelet(self) -> None:
        """Raise SocketPathTaken, naming the socket and its process, when a kubelet or
        another simulator answers on one of the sockets this one would serve: starting
        would take them over (and its plugins' sockets with them)."""
        for path in (self.registration_socket, self.pod_resources_socket, self.control_socket):
            if path is not None and (holder := socket_holder(path)) is not None:
                raise SocketPathTaken(
                    f"{path} is served by {holder}: a kubelet (or another simulator) runs "
                    "on this folder; the simulator does not start beside it"
                )

    def _cleanup_plugin_dir(self) -> None:
        """Remove what a starting kubelet removes from the plugin folder, short of
        harming anyone: sockets nobody answers on, and the sockets of the plugins that
        registered with this simulator (a restart). A socket of another live process,
        files, links and folders stay."""
        keep = {self.checkpoint_path, self.pod_resources_socket}
        if self.control_socket is not None:
            keep.add(self.control_socket)
        removed, left = [], []
        for path in sorted(self.plugin_dir.iterdir()):
            if path in keep:
                continue
            try:
                mode = path.lstat().st_mode
            except OSError as error:
                log.error("failed to stat %s: %s", path, error)
                continue
            if not stat.S_ISSOCK(mode):
                continue
            if path not in self._plugin_sockets and socket_holder(path) is not None:
                left.append(path.name)
                continue
            try:
                path.unlink()
            except OSError as error:
                log.error("failed to remove %s: %s", path, error)
                continue
            removed.append(path.name)
        self._plugin_sockets.clear()
        if removed:
            log.info("removed plugin sockets from %s: %s", self.plugin_dir, ", ".join(removed))
        if left:
            log.info(
                "left the sockets of live processes in %s: %s (they register when they see "
                "kubelet.sock)",
                self.plugin_dir,
                ", ".join(left),
            )

    @staticmethod
    def _keep_aside(path: Path) -> Path | str:
        """An unusable state file renamed aside (never overwritten): where it went."""
        try:
            return keep_aside(path)
        except OSError as error:
            return f"where it was ({error.strerror or error})"

    def _require_running(self) -> DeviceManager:
        if not self._running or self._manager is None:
            raise RuntimeError("the kubelet simulator is not running")
        return self._manager

    # -- events (kept by an EventLog) -----------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every event from now on; returns a function that stops it."""
        return self._log.add_listener(listener)

    @property
    def events(self) -> list[KubeletEvent]:
        """The most recent events, oldest first."""
        return self._log.events

    @property
    def last_event_seq(self) -> int:
        """The `seq` of the latest event (0 before any): pass it as `after` to wait
        for what happens next."""
        return self._log.last_seq

    async def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "a condition"
    ) -> None:
        """Wait until `predicate()` holds, re-checking it after every event."""
        await self._log.wait_for(predicate, timeout, what)

    async def wait_for_event(
        self,
        kind: str,
        *,
        resource: str | None = None,
        pod: str | None = None,
        after: int = 0,
        timeout: float = 10.0,
    ) -> KubeletEvent:
        """The first event of `kind` (for `resource` / `pod` "namespace/name" if given)
        with a `seq` above `after`, waiting for it if it has not happened yet."""
        return await self._log.wait_for_event(
            kind, resource=resource, pod=pod, after=after, timeout=timeout
        )

    def _emit(self, kind: str, *, resource: str = "", pod: str = "", detail: str = "") -> None:
        self._log.emit(kind, resource=resource, pod=pod, detail=detail)

    def _manager_event(self, kind: str, resource: str, detail: str) -> None:
        self._log.emit(kind, resource=resource, detail=detail)

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

        def ready() -> bool:
            status = self.resource_status(name)
            return (
                status is not None
                and status.endpoint == "connected"
                and status.listed
                and (count is None or status.allocatable == count)
                and (capacity is None or status.capacity == capacity)
            )

        want = "".join(
            f", {k} {v}" for k, v in (("count", count), ("capacity", capacity)) if v is not None
        )
        await self.wait_for(ready, timeout, f"resource {name}{want}")
        status = self.resource_status(name)
        assert status is not None
        return status

    def registrations(self, resource: str) -> int:
        """Successful registrations of `resource` since this object was made."""
        return self._registrations[resource]

    async def wait_for_registration(
        self, resource: str, *, after: int = 0, timeout: float = 10.0
    ) -> int:
        """Wait until `resource` has registered more than `after` times; the count."""
        await self.wait_for(
            lambda: self._registrations[resource] > after,
            timeout,
            f"registration {after + 1} of {resource}",
        )
        return self._registrations[resource]

    # -- registration ---------------------------------------------------------------------

    def _refuse(self, resource: str, message: str) -> RegistrationRefused:
        log.warning("registration of %r refused: %s", resource, message)
        self._emit(REGISTRATION_REFUSED, resource=resource, detail=message)
        return RegistrationRefused(message)

    async def _register(self, request: pb.RegisterRequest) -> None:
        resource = request.resource_name
        # The kubelet counts every request, before it checks it.
        self._registration_total[resource] += 1
        log.info(
            "Got registration request from device plugin with resource %s (endpoint %s)",
            resource,
            request.endpoint,
        )
        problem = request_problem(request, self.plugin_dir)
        if problem is not None:
            raise self._refuse(resource, problem)
        manager = self._manager
        if manager is None:
            raise self._refuse(resource, "the kubelet is not running")
        lock = self._register_locks.setdefault(resource, asyncio.Lock())
        async with lock:
            try:
                await manager.register(resource, self.plugin_dir / request.endpoint)
            except EndpointError as error:
                raise self._refuse(resource, str(error)) from None
        self._registrations[resource] += 1
        self._plugin_sockets.add(self.plugin_dir / request.endpoint)
        log.info("%s: registered, endpoint %s", resource, request.endpoint)
        self._emit(REGISTERED, resource=resource, detail=request.endpoint)

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
                results.append(await self._admit(item))
        return results

    async def _admit(self, item: PodSpec | InvalidPod) -> PodResult:
        manager = self._require_running()
        if isinstance(item, InvalidPod):
            return self._rejected(item.name, item.namespace, "", REASON_INVALID, item.message)
        existing = self._pods.get(item.key)
        if existing is not None and _same_pod(existing.spec, item):
            return msgspec.structs.replace(existing.result, unchanged=True)
        if existing is not None or item.uid in self._uids:
            return self._rejected(
                item.name,
                item.namespace,
                item.uid,
                REASON_ALREADY_EXISTS,
                f'pods "{item.name}" already exists with another spec (or uid); delete it '
                "to apply this one",
            )
        rejection = await manager.admit(item)
        if rejection is not None:
            return self._rejected(
                item.name, item.namespace, item.uid, rejection.reason, rejection.message
            )
        cdi: dict[str, list[str]] = {}
        if self.dra is not None:
            from devplug.simulator.dra import PrepareError

            try:
                cdi = await self.dra.prepare_pod(item)
            except PrepareError as error:
                manager.remove_pod(item.uid)
                return self._rejected(item.name, item.namespace, item.uid, error.reason, str(error))
        containers = await self._start_containers(manager, item, cdi)
        result = PodResult(item.name, item.namespace, item.uid, True, containers=containers)
        self._pods[item.key] = _Pod(item, result)
        self._uids.add(item.uid)
        self._pod_list.add(item.uid, _stored(item))
        log.info("pod %s/%s admitted", item.namespace, item.name)
        self._emit(POD_ADMITTED, pod=f"{item.namespace}/{item.name}")
        return result

    def _rejected(
        self, name: str, namespace: str, uid: str, reason: str, message: str
    ) -> PodResult:
        log.warning("pod %s/%s rejected: %s: %s", namespace, name, reason, message)
        self._emit(POD_REJECTED, pod=f"{namespace}/{name}", detail=f"{reason}: {message}")
        return PodResult(name, namespace, uid, False, reason, message)

    async def _start_containers(
        self, manager: DeviceManager, pod: PodSpec, cdi: Mapping[str, list[str]]
    ) -> list[ContainerResult]:
        """Start the containers in order: PreStartContainer where the plugin asks for it,
        then the runtime options of the CRI CreateContainer request."""
        results = []
        blocked = False
        for container in pod.all_containers:
            devices = self._container_devices(manager, pod.uid, container.name)
            options = _with_cdi(
                manager.run_options(pod.uid, container.name), cdi.get(container.name, [])
            )
            if blocked:
                results.append(
                    ContainerResult(
                        container.name,
                        container.init,
                        WAITING,
                        devices,
                        options,
                        message="an init container before it did not start",
                    )
                )
                continue
            try:
                called = await manager.pre_start(pod, container)
            except AdmissionError as error:
                log.warning(
                    "pod %s/%s container %s: %s", pod.namespace, pod.name, container.name, error
                )
                results.append(
                    ContainerResult(
                        container.name,
                        container.init,
                        CREATE_CONTAINER_CONFIG_ERROR,
                        devices,
                        options,
                        message=str(error),
                    )
                )
                blocked = blocked or container.init
                continue
            results.append(
                ContainerResult(
                    container.name, container.init, STARTED, devices, options, pre_started=called
                )
            )
        return results

    @staticmethod
    def _container_devices(
        manager: DeviceManager, pod_uid: str, container: str
    ) -> dict[str, list[str]]:
        held = manager.container_devices(pod_uid, container)
        return {resource: held[resource].ids() for resource in sorted(held)}

    def _restored_result(self, spec: PodSpec) -> PodResult:
        manager = self._manager
        assert manager is not None
        cdi = self.dra.container_cdi(spec) if self.dra is not None else {}
        containers = [
            ContainerResult(
                c.name,
                c.init,
                STARTED,
                self._container_devices(manager, spec.uid, c.name),
                _with_cdi(manager.run_options(spec.uid, c.name), cdi.get(c.name, [])),
            )
            for c in spec.all_containers
        ]
        return PodResult(spec.name, spec.namespace, spec.uid, True, containers=containers)

    async def delete_pod(self, name: str, namespace: str = "default") -> bool:
        """Delete a pod and free its devices; False when there is no such pod."""
        manager = self._require_running()
        async with self._admit_lock:
            entry = self._pods.pop((namespace, name), None)
            if entry is None:
                return False
            self._uids.discard(entry.spec.uid)
            manager.remove_pod(entry.spec.uid)
            if self.dra is not None:
                await self.dra.unprepare_pod(entry.spec)
            self._pod_list.remove(entry.spec.uid)
        log.info("pod %s/%s deleted", namespace, name)
        self._emit(POD_DELETED, pod=f"{namespace}/{name}")
        return True

    def pods(self) -> list[PodSummary]:
        return [
            PodSummary(p.spec.name, p.spec.namespace, p.spec.uid, p.result.containers)
            for p in self._pods.values()
        ]

    def pod(self, name: str, namespace: str = "default") -> PodResult | None:
        entry = self._pods.get((namespace, name))
        return entry.result if entry is not None else None

    def _load_pods(self) -> None:
        for item in self._pod_list.load():
            manifest = dict(item.get("manifest") or {})
            meta = dict(manifest.get("metadata") or {})
            meta["uid"] = item.get("uid")
            manifest["metadata"] = meta
            spec = parse_pod(manifest)
            if isinstance(spec, InvalidPod):
                log.error("skipping a stored pod: %s", spec.message)
                continue
            self._pods[spec.key] = _Pod(
                spec, PodResult(spec.name, spec.namespace, spec.uid, True, containers=[])
            )
            self._uids.add(spec.uid)
        self._pod_list.reset((p.spec.uid, _stored(p.spec)) for p in self._pods.values())
        if self._pods:
            log.info("%d pods restored from %s", len(self._pods), self.pods_path)

    # -- status ------------------------------------------------------------------------------

    def resource_status(self, name: str) -> ResourceStatus | None:
        manager = self._manager
        if manager is None or name not in manager.resources:
            return None
        state = manager.resources[name]
        holders: dict[str, list[str]] = {}
        for entry in self._pods.values():
            for container, held in manager.pod_devices.get(entry.spec.uid, {}).items():
                allocation = held.get(name)
                for device_id in allocation.ids() if allocation is not None else ():
                    holders.setdefault(device_id, []).append(
                        f"{entry.spec.namespace}/{entry.spec.name}/{container}"
                    )
        ids = state.ordered(state.healthy | state.unhealthy | set(state.devices))
        devices = []
        for device_id in ids:
            info = state.devices.get(device_id)
            devices.append(
                DeviceStatus(
                    device_id,
                    device_id in state.healthy,
                    list(info.numa_nodes) if info is not None else [],
                    holders.get(device_id, []),
                )
            )
        endpoint = state.endpoint
        return ResourceStatus(
            name=name,
            capacity=state.capacity,
            allocatable=len(state.healthy),
            allocated=len(manager.in_use(name)),
            endpoint="connected" if endpoint.connected else "stopped",
            devices=devices,
            listed=state.listed_by is endpoint and endpoint.connected,
            grace_left_s=manager.grace_left(name),
            pre_start_required=endpoint.pre_start_required,
            preferred_allocation=endpoint.preferred_allocation,
        )

    def node_status(self) -> NodeStatus:
        manager = self._manager
        names = sorted(manager.resources) if manager is not None else []
        resources = [s for s in map(self.resource_status, names) if s is not None]
        return NodeStatus(
            resources=resources,
            pods=self.pods(),
            registration_total=dict(sorted(self._registration_total.items())),
            registrations=dict(sorted(self._registrations.items())),
            alloc_duration={k: v.snapshot() for k, v in sorted(self._alloc_durations.items())},
            topology_policy=self.topology_policy,
            numa_nodes=manager.numa_nodes if manager is not None else list(self._numa_nodes or []),
            checkpoint_problem=self.checkpoint_problem,
            dra_drivers=self.dra.driver_versions() if self.dra else {},
            dra_claims=self.dra.claim_status() if self.dra else [],
        )

    def metrics_text(self) -> str:
        """The device-plugin metrics in Prometheus text format."""
        from devplug.simulator.report import metrics_text

        return metrics_text(self.node_status())

    # -- PodResources source -----------------------------------------------------------------

    def active_pods(self) -> Sequence[PodSpec]:
        return [p.spec for p in self._pods.values()]

    def find_pod(self, name: str, namespace: str) -> PodSpec | None:
        entry = self._pods.get((namespace, name))
        return entry.spec if entry is not None else None

    def allocations(self, pod_uid: str, container: str) -> Mapping[str, Allocation]:
        manager = self._manager
        return manager.container_devices(pod_uid, container) if manager is not None else {}

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceInfo]]:
        manager = self._manager
        if manager is None:
            return {}
        return {
            name: [d for d in state.devices.values() if d.id in state.healthy]
            for name, state in manager.resources.items()
        }


def _stored(spec: PodSpec) -> dict[str, Any]:
    """The pod as the pod list keeps it."""
    return {"uid": spec.uid, "manifest": spec.manifest}


def _with_cdi(options: RuntimeOptions, cdi: Sequence[str]) -> RuntimeOptions:
    """The options with the CDI devices of the container's prepared claims added."""
    if not cdi:
        return options
    merged = list(dict.fromkeys([*options.cdi_devices, *cdi]))
    return msgspec.structs.replace(options, cdi_devices=merged)


def _same_pod(running: PodSpec, applied: PodSpec) -> bool:
    """Whether `applied` is the pod that runs again: the same containers and requests,
    and the same uid when the manifest gives one (without one, a uid is made up)."""
    meta = applied.manifest.get("metadata") if isinstance(applied.manifest, Mapping) else None
    uid_given = isinstance(meta, Mapping) and bool(meta.get("uid"))
    return (
        running.init_containers == applied.init_containers
        and running.containers == applied.containers
        and (not uid_given or running.uid == applied.uid)
    )


def leave_dead_socket(path: Path) -> None:
    """A socket file at `path` that nobody listens on, as a killed process leaves its
    listening socket: connecting to it is refused."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        dead.bind(os.fspath(path))
    finally:
        dead.close()
