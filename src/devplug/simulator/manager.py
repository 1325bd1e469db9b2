"""The device manager: registered resources, their devices, allocation and the checkpoint.

It follows the kubelet's device manager step by step (pkg/kubelet/cm/devicemanager):
capacity counts every device of a resource and allocatable only the healthy ones; a
resource whose plugin went away keeps its devices, all unhealthy, for the grace period
and is then dropped; each container of a pod is allocated in turn (init containers
first, their devices reusable by the containers after them), asking the plugin for its
preferred devices when it offers that, within the NUMA nodes the topology manager chose,
and calling Allocate once per container and resource; the allocations are checkpointed
after every change.

Where the kubelet iterates Go sets (in random order) the simulator uses the order in
which the plugin listed its devices, so that its choices are reproducible.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from devplug.api.constants import HEALTHY
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator import checkpoint, topology
from devplug.simulator.endpoint import CLOSED_BY_PLUGIN, Endpoint, EndpointError
from devplug.simulator.events import ENDPOINT_STOPPED, RESOURCE_REMOVED
from devplug.simulator.pods import ContainerSpec, PodSpec
from devplug.simulator.results import (
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    AllocDuration,
    DeviceSpec,
    KeyValue,
    Mount,
    RuntimeOptions,
)

log = logging.getLogger("devplug.simulator.manager")

# The buckets of kubelet_device_plugin_alloc_duration_seconds (Prometheus defaults).
ALLOC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AdmissionError(Exception):
    """Allocation for a container failed; the text is the kubelet's error."""


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    id: str
    healthy: bool
    numa_nodes: tuple[int, ...]


@dataclass(slots=True)
class ResourceState:
    """One resource's devices. `devices`, `healthy` and `unhealthy` change through
    `set_devices` and `mark_unhealthy` only, which keep the derived views up to date."""

    endpoint: Endpoint
    # every device the plugin listed last (allDevices), in its order
    devices: dict[str, DeviceInfo] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    watch: asyncio.Task[None] | None = None
    # the endpoint whose list `devices` is (None: restored, or not listed yet)
    listed_by: Endpoint | None = None
    expiry: asyncio.TimerHandle | None = None
    expires_at: float | None = None
    # derived: the healthy devices in listing order, each device's NUMA nodes, and
    # whether any device reports one
    healthy_ids: list[str] = field(default_factory=list)
    topology: dict[str, tuple[int, ...]] = field(default_factory=dict)
    has_topology: bool = False

    @property
    def capacity(self) -> int:
        return len(self.healthy) + len(self.unhealthy)

    def ordered(self, ids: Iterable[str]) -> list[str]:
        """`ids` in the plugin's listing order (unknown ones last, by name)."""
        wanted = set(ids)
        known = [d for d in self.devices if d in wanted]
        return known + sorted(wanted - set(known))

    def set_devices(self, devices: Iterable[DeviceInfo]) -> None:
        """Replace the device list (a ListAndWatch message)."""
        self.devices = {d.id: d for d in devices}
        self.healthy = {d.id for d in self.devices.values() if d.healthy}
        self.unhealthy = set(self.devices) - self.healthy
        self.topology = {d.id: d.numa_nodes for d in self.devices.values()}
        self.has_topology = any(self.topology.values())
        self.healthy_ids = self.ordered(self.healthy)

    def mark_unhealthy(self) -> None:
        """Every device unhealthy (the plugin went away); capacity stays."""
        self.unhealthy |= self.healthy
        self.healthy = set()
        self.healthy_ids = []


@dataclass(slots=True)
class Allocation:
    """The devices of one resource held by one container (a checkpoint entry)."""

    numa: dict[int, list[str]]
    response: pb.ContainerAllocateResponse | None

    def ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for node in sorted(self.numa):
            for device_id in self.numa[node]:
                seen[device_id] = None
        return list(seen)


@dataclass(slots=True)
class Histogram:
    count: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(ALLOC_BUCKETS))

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        for i, bound in enumerate(ALLOC_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def snapshot(self) -> AllocDuration:
        return AllocDuration(
            self.count, self.total, list(zip(ALLOC_BUCKETS, self.buckets, strict=True))
        )


# Called with (kind, resource, detail) on every change worth telling.
EventSink = Callable[[str, str, str], None]


class DeviceManager:
    def __init__(
        self,
        checkpoint_path: Path | None,
        *,
        policy: str = topology.POLICY_NONE,
        numa_nodes: Sequence[int] | None = None,
        grace_period: float,
        dial_timeout: float,
        on_event: EventSink | None = None,
        alloc_durations: dict[str, Histogram] | None = None,
    ) -> None:
        self.checkpoint_path = checkpoint_path
        self.policy = policy
        self._numa_nodes = list(numa_nodes) if numa_nodes is not None else None
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        self._on_event = on_event or (lambda kind, resource, detail: None)
        self.resources: dict[str, ResourceState] = {}
        # pod UID -> container -> resource -> allocation; changed through _hold and
        # _release only, which keep the indexes below and the checkpoint in step
        self.pod_devices: dict[str, dict[str, dict[str, Allocation]]] = {}
        self.alloc_durations = alloc_durations if alloc_durations is not None else {}
        # pod UID -> container -> the topology manager's choice
        self._affinity: dict[str, dict[str, topology.TopologyHint]] = {}
        # resource -> device -> how many allocations (with a response) hold it
        self._in_use: dict[str, collections.Counter[str]] = {}
        # resource -> how many allocations there are (with a response or not)
        self._held: collections.Counter[str] = collections.Counter()
        # resource -> its available devices in listing order, while known
        self._free: dict[str, list[str]] = {}
        # the NUMA nodes the devices report (when not configured)
        self._device_numa_nodes = [0]
        # None: a node kept in memory only, without a checkpoint
        self._checkpoint = (
            checkpoint.CheckpointWriter(checkpoint_path) if checkpoint_path is not None else None
        )
        self._closed = False

    # -- topology ----------------------------------------------------------------------

    @property
    def numa_nodes(self) -> list[int]:
        """The node's NUMA nodes: as configured, else every node a device reports (or 0)."""
        if self._numa_nodes is not None:
            return self._numa_nodes
        return self._device_numa_nodes

    def _topology(self, resource: str) -> dict[str, tuple[int, ...]]:
        state = self.resources.get(resource)
        return {} if state is None else state.topology

    def _has_topology(self, resource: str) -> bool:
        state = self.resources.get(resource)
        return state is not None and state.has_topology

    def _devices_changed(self) -> None:
        """Device lists or the set of resources changed: renew what derives from them."""
        self._free.clear()
        seen = {
            n for state in self.resources.values() for ns in state.topology.values() for n in ns
        }
        self._device_numa_nodes = sorted(seen) or [0]
        if self._checkpoint is not None:
            self._checkpoint.set_registered(
                {resource: state.healthy_ids for resource, state in self.resources.items()}
            )

    # -- registration and device lists ------------------------------------------------

    async def register(self, resource: str, socket_path: Path) -> Endpoint:
        """Connect to a registering plugin and make it the resource's endpoint."""
        endpoint = await Endpoint.connect(resource, socket_path, self.dial_timeout)
        return await self.attach(resource, endpoint)

    async def attach(self, resource: str, endpoint: Endpoint) -> Endpoint:
        """Make a connected `endpoint` the resource's one (a registration after the
        dial; an in-process plugin of a simulated fleet node without one)."""
        if self._closed:
            await endpoint.close()
            raise EndpointError("the kubelet is stopping")
        old = self.resources.get(resource)
        if old is None:
            state = ResourceState(endpoint)
            self.resources[resource] = state
            self._devices_changed()
        else:
            state = old
            self._cancel_expiry(state)
            previous, previous_watch = state.endpoint, state.watch
            state.endpoint = endpoint
            await previous.close()
            if previous_watch is not None:
                previous_watch.cancel()
        state.watch = asyncio.create_task(self._watch(resource, endpoint), name=f"watch {resource}")
        return endpoint

    async def _watch(self, resource: str, endpoint: Endpoint) -> None:
        why = await endpoint.list_and_watch(
            lambda devices: self._on_devices(resource, endpoint, devices)
        )
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint or self._closed:
            return  # replaced or shutting down: nothing to mark
        if why == CLOSED_BY_PLUGIN:  # the plugin stopping: what it meant to do
            log.info("%s: the device plugin closed its ListAndWatch stream", resource)
        else:
            log.warning("%s: ListAndWatch ended unexpectedly for device plugin: %s", resource, why)
        await endpoint.close()
        state.mark_unhealthy()
        self._devices_changed()
        self._schedule_expiry(resource, state)
        self.write_checkpoint()
        self._on_event(ENDPOINT_STOPPED, resource, why)

    def _on_devices(self, resource: str, endpoint: Endpoint, devices: Sequence[pb.Device]) -> None:
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint:
            return
        state.set_devices(
            DeviceInfo(d.ID, d.health == HEALTHY, tuple(int(n.ID) for n in d.topology.nodes))
            for d in devices
        )
        state.listed_by = endpoint
        self._devices_changed()
        log.info(
            "%s: device list pushed: %d devices, %d healthy",
            resource,
            len(state.devices),
            len(state.healthy),
        )
        self.write_checkpoint()
        self._on_event("devices", resource, f"{len(state.healthy)}/{len(state.devices)} healthy")

    def _schedule_expiry(self, resource: str, state: ResourceState) -> None:
        self._cancel_expiry(state)
        loop = asyncio.get_running_loop()
        state.expires_at = time.monotonic() + self.grace_period
        state.expiry = loop.call_later(self.grace_period, self._expire, resource, state.endpoint)

    @staticmethod
    def _cancel_expiry(state: ResourceState) -> None:
        if state.expiry is not None:
            state.expiry.cancel()
        state.expiry = None
        state.expires_at = None

    def _expire(self, resource: str, endpoint: Endpoint) -> None:
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint or not endpoint.stopped_endpoint:
            return
        del self.resources[resource]
        self._devices_changed()
        log.info("%s: grace period over, resource removed", resource)
        self.write_checkpoint()
        self._on_event(RESOURCE_REMOVED, resource, "")

    def grace_left(self, resource: str) -> float | None:
        state = self.resources.get(resource)
        if state is None or state.expires_at is None:
            return None
        return max(0.0, state.expires_at - time.monotonic())

    # -- allocation state ----------------------------------------------------------------

    def in_use(self, resource: str) -> set[str]:
        """The devices of `resource` that allocations hold."""
        return set(self._in_use.get(resource, ()))

    def is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self.resources or self._held[resource] > 0

    def container_devices(self, pod_uid: str, container: str) -> dict[str, Allocation]:
        return dict(self.pod_devices.get(pod_uid, {}).get(container, {}))

    def _hold(self, pod_uid: str, container: str, resource: str, allocation: Allocation) -> None:
        """Record an allocation (replacing the container's earlier one of `resource`)."""
        held = self.pod_devices.setdefault(pod_uid, {}).setdefault(container, {})
        previous = held.get(resource)
        if previous is not None:
            self._count_out(resource, previous)
        held[resource] = allocation
        self._held[resource] += 1
        if allocation.response is None:
            return
        self._in_use.setdefault(resource, collections.Counter()).update(allocation.ids())
        free = self._free.get(resource)
        if free is not None:
            for device_id in allocation.ids():
                with contextlib.suppress(ValueError):  # taken already, or not healthy
                    free.remove(device_id)
        if self._checkpoint is not None:
            self._checkpoint.put(
                checkpoint.Entry(
                    pod_uid,
                    container,
                    resource,
                    {node: list(ids) for node, ids in allocation.numa.items()},
                    allocation.response.SerializeToString(deterministic=True),
                )
            )

    def _count_out(self, resource: str, allocation: Allocation) -> None:
        self._held[resource] -= 1
        if self._held[resource] <= 0:
            del self._held[resource]
        self._free.pop(resource, None)
        if allocation.response is not None:
            used = self._in_use[resource]
            used.subtract(allocation.ids())
            for device_id in allocation.ids():
                if used[device_id] <= 0:
                    del used[device_id]

    def _release(self, pod_uid: str) -> bool:
        """Forget the pod's allocations; False when it has none."""
        self._affinity.pop(pod_uid, None)
        containers = self.pod_devices.pop(pod_uid, None)
        if containers is None:
            return False
        for held in containers.values():
            for resource, allocation in held.items():
                self._count_out(resource, allocation)
        if self._checkpoint is not None:
            self._checkpoint.remove_pod(pod_uid)
        return True

    def remove_pod(self, pod_uid: str) -> bool:
        if not self._release(pod_uid):
            return False
        self.write_checkpoint()
        return True

    def available(self, resource: str) -> list[str]:
        """Healthy devices no allocation holds, in the plugin's listing order."""
        state = self.resources.get(resource)
        if state is None:
            return []
        free = self._free.get(resource)
        if free is None:
            used: Mapping[str, int] = self._in_use.get(resource) or {}
            free = self._free[resource] = [d for d in state.healthy_ids if d not in used]
        return list(free)

    # -- admission -------------------------------------------------------------------

    async def admit(self, pod: PodSpec) -> Rejection | None:
        """Allocate every container of `pod` (topology manager + device manager); a
        rejected pod holds no devices afterwards."""
        rejection = await self._admit(pod)
        if rejection is not None:
            self.remove_pod(pod.uid)
        return rejection

    async def _admit(self, pod: PodSpec) -> Rejection | None:
        reusable: dict[str, dict[str, None]] = {}
        for container in pod.all_containers:
            if self.policy != topology.POLICY_NONE:
                hints = self.topology_hints(pod.uid, container, reusable)
                best, admit = topology.merge(self.policy, self.numa_nodes, hints)
                log.debug(
                    "%s/%s %s: hints %s, best %s",
                    pod.namespace,
                    pod.name,
                    container.name,
                    hints,
                    best,
                )
                if not admit:
                    return Rejection(
                        REASON_TOPOLOGY_AFFINITY,
                        "Resources cannot be allocated with Topology locality",
                    )
                self._affinity.setdefault(pod.uid, {})[container.name] = best
            try:
                await self._allocate_container(pod, container, reusable)
            except AdmissionError as error:
                return Rejection(
                    REASON_UNEXPECTED_ADMISSION,
                    f"Allocate failed due to {error}, which is unexpected",
                )
            # Devices of init containers can be reused by the containers after them;
            # app containers and sidecars keep theirs.
            for resource, allocation in self.container_devices(pod.uid, container.name).items():
                current = reusable.setdefault(resource, {})
                for device_id in allocation.ids():
                    if container.init and not container.restartable:
                        current[device_id] = None
                    else:
                        current.pop(device_id, None)
        return None

    def topology_hints(
        self, pod_uid: str, container: ContainerSpec, reusable: Mapping[str, Mapping[str, None]]
    ) -> dict[str, list[topology.TopologyHint] | None]:
        """The device manager's hints for one container (GetTopologyHints)."""
        hints: dict[str, list[topology.TopologyHint] | None] = {}
        for resource, requested in container.devices.items():
            if not self.is_device_plugin_resource(resource):
                continue
            if not self._has_topology(resource):
                hints[resource] = None
                continue
            available = self.available(resource)
            reuse = list(reusable.get(resource, {}))
            if len(set(available) | set(reuse)) < requested:
                hints[resource] = []
                continue
            hints[resource] = topology.device_hints(
                self.numa_nodes, self._topology(resource), available, reuse, requested
            )
        return hints

    async def _allocate_container(
        self, pod: PodSpec, container: ContainerSpec, reusable: Mapping[str, Mapping[str, None]]
    ) -> None:
        for resource, needed in container.devices.items():
            if not self.is_device_plugin_resource(resource):
                continue
            ids = await self._devices_to_allocate(
                pod.uid, container.name, resource, needed, list(reusable.get(resource, {}))
            )
            if not ids:
                continue
            state = self.resources.get(resource)
            if state is None:
                raise AdmissionError(f"unknown Device Plugin {resource}")
            started = time.monotonic()
            try:
                response = await state.endpoint.allocate(ids)
            except EndpointError as error:
                raise AdmissionError(str(error)) from None
            finally:
                self.alloc_durations.setdefault(resource, Histogram()).observe(
                    time.monotonic() - started
                )
            if not response.container_responses:
                raise AdmissionError(f"no containers return in allocation response {response}")
            numa: dict[int, list[str]] = {}
            topo = state.topology
            for device_id in ids:
                for node in topo.get(device_id) or (checkpoint.NO_NUMA,):
                    numa.setdefault(node, []).append(device_id)
            self._hold(
                pod.uid, container.name, resource, Allocation(numa, response.container_responses[0])
            )
            self.write_checkpoint()

    async def _devices_to_allocate(
        self, pod_uid: str, container: str, resource: str, required: int, reusable: list[str]
    ) -> list[str]:
        state = self.resources.get(resource)
        if state is None:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        if not state.healthy:
            raise AdmissionError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        needed = required
        if needed == 0:
            return []
        allocated: dict[str, None] = {}

        def take(candidates: Iterable[str]) -> bool:
            nonlocal needed
            for device_id in candidates:
                if device_id in allocated:
                    continue
                allocated[device_id] = None
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(reusable):
            return list(allocated)
        available = self.available(resource)
        if len(available) < needed:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned, unaligned, no_affinity = self._filter_by_affinity(
            pod_uid, container, resource, available
        )
        if needed < len(aligned):
            offer = state.ordered([*aligned, *allocated]) if allocated else aligned
            preferred = await self._preferred(resource, offer, list(allocated), required)
            aligned_set = set(aligned)
            if take(d for d in preferred if d in aligned_set) or take(aligned):
                return list(allocated)
            raise AdmissionError(
                "unexpectedly allocated less resources than required. "
                f"Requested: {required}, Got: {required - needed}"
            )
        if take(aligned):
            return list(allocated)
        offer = state.ordered([*available, *allocated]) if allocated else available
        preferred = await self._preferred(resource, offer, list(allocated), required)
        available_set = set(available)
        if take(d for d in preferred if d in available_set) or take(unaligned) or take(no_affinity):
            return list(allocated)
        raise AdmissionError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )

    def _filter_by_affinity(
        self, pod_uid: str, container: str, resource: str, available: list[str]
    ) -> tuple[list[str], list[str], list[str]]:
        """Split `available` into devices on the chosen NUMA nodes, on other nodes, and
        without NUMA node."""
        hint = self._affinity.get(pod_uid, {}).get(container)
        if hint is None or hint.affinity is None or not self._has_topology(resource):
            return [], [], list(available)
        topo = self._topology(resource)
        per_node: dict[int, set[str]] = {}
        for device_id in available:
            for node in topo.get(device_id) or (checkpoint.NO_NUMA,):
                per_node.setdefault(node, set()).add(device_id)
        mask = hint.affinity

        def rank(node: int) -> tuple[int, int, int]:
            if node == checkpoint.NO_NUMA:
                group = 2
            elif topology.any_set(mask, [node]):
                group = 0
            else:
                group = 1
            return (group, len(per_node[node]), node)

        nodes = sorted(per_node, key=rank)
        aligned: list[str] = []
        unaligned: list[str] = []
        without: list[str] = []
        for device_id in available:
            for node in nodes:
                if device_id in per_node[node]:
                    if node == checkpoint.NO_NUMA:
                        without.append(device_id)
                    elif topology.any_set(mask, [node]):
                        aligned.append(device_id)
                    else:
                        unaligned.append(device_id)
                    break
        return aligned, unaligned, without

    async def _preferred(
        self, resource: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        state = self.resources.get(resource)
        if state is None:
            raise AdmissionError(
                f"endpoint not found in cache for a registered resource: {resource}"
            )
        if not state.endpoint.preferred_allocation:
            return []
        try:
            return await state.endpoint.preferred(available, must_include, size)
        except EndpointError as error:
            raise AdmissionError(
                f"device plugin GetPreferredAllocation rpc failed with err: {error}"
            ) from None

    # -- container start ---------------------------------------------------------------

    async def pre_start(self, pod: PodSpec, container: ContainerSpec) -> list[str]:
        """PreStartContainer for the container's resources whose plugin asks for it;
        returns those resources; AdmissionError (kubelet wording) when one fails."""
        called = []
        for resource, count in container.devices.items():
            if not self.is_device_plugin_resource(resource) or count == 0:
                continue
            state = self.resources.get(resource)
            if state is None:
                raise AdmissionError(
                    f"endpoint not found in cache for a registered resource: {resource}"
                )
            if not state.endpoint.pre_start_required:
                continue
            allocation = self.container_devices(pod.uid, container.name).get(resource)
            if allocation is None:
                raise AdmissionError(
                    f"no devices found allocated in local cache for pod {pod.uid}, "
                    f"container {container.name}, resource {resource}"
                )
            try:
                await state.endpoint.pre_start(allocation.ids())
            except EndpointError as error:
                raise AdmissionError(
                    f"device plugin PreStartContainer rpc failed with err: {error}"
                ) from None
            called.append(resource)
        return called

    def run_options(self, pod_uid: str, container: str) -> RuntimeOptions:
        """The container's runtime options, merged over its resources (first one wins)."""
        devices: dict[str, DeviceSpec] = {}
        mounts: dict[str, Mount] = {}
        envs: dict[str, str] = {}
        annotations: dict[str, str] = {}
        cdi: dict[str, None] = {}
        held = self.container_devices(pod_uid, container)
        for resource in sorted(held):
            response = held[resource].response
            if response is None:
                continue
            for key in sorted(response.envs):
                if key in envs and envs[key] != response.envs[key]:
                    log.error(
                        "env %s has conflicting settings: %s and %s",
                        key,
                        envs[key],
                        response.envs[key],
                    )
                envs.setdefault(key, response.envs[key])
            for spec in response.devices:
                devices.setdefault(
                    spec.container_path,
                    DeviceSpec(spec.container_path, spec.host_path, spec.permissions),
                )
            for mount in response.mounts:
                mounts.setdefault(
                    mount.container_path,
                    Mount(mount.container_path, mount.host_path, mount.read_only),
                )
            for key in sorted(response.annotations):
                annotations.setdefault(key, response.annotations[key])
            for device in response.cdi_devices:
                cdi[device.name] = None
        return RuntimeOptions(
            devices=list(devices.values()),
            mounts=list(mounts.values()),
            envs=[KeyValue(k, v) for k, v in envs.items()],
            annotations=[KeyValue(k, v) for k, v in annotations.items()],
            cdi_devices=list(cdi),
        )

    # -- checkpoint ----------------------------------------------------------------------

    def checkpoint_data(self) -> checkpoint.CheckpointData:
        """What the checkpoint holds (and the file, once written)."""
        if self._checkpoint is None:
            return checkpoint.CheckpointData(None, {})
        return self._checkpoint.data()

    def write_checkpoint(self) -> None:
        if self._closed or self._checkpoint is None:
            return
        try:
            self._checkpoint.write()
        except OSError as error:
            log.error("failed to write checkpoint file %s: %s", self.checkpoint_path, error)

    def restore(self, known_pods: Iterable[str]) -> str | None:
        """Load allocations and registered resources from the checkpoint.

        Allocations of pods not in `known_pods` are released, as the kubelet releases
        those of pods that are no longer active. Returns why the checkpoint could not be
        used, or None.
        """
        if self.checkpoint_path is None:
            return None
        try:
            data = checkpoint.read(self.checkpoint_path)
        except checkpoint.CheckpointError as error:
            problem = f"{self.checkpoint_path}: {error}"
            log.error(
                "Continue after failing to read checkpoint file. Device allocation info may "
                "NOT be up-to-date: %s",
                problem,
            )
            return problem
        if data is None:
            log.info("no checkpoint at %s: starting without allocations", self.checkpoint_path)
            return None
        known = set(known_pods)
        for entry in data.entries or ():
            if entry.pod_uid not in known:
                log.info(
                    "releasing %s devices of pod %s (container %s): pod unknown to this node",
                    entry.resource,
                    entry.pod_uid,
                    entry.container,
                )
                continue
            try:
                response = pb.ContainerAllocateResponse.FromString(entry.alloc_resp or b"")
            except DecodeError as error:
                log.error(
                    "can't unmarshal allocResp for %s %s %s: %s",
                    entry.pod_uid,
                    entry.container,
                    entry.resource,
                    error,
                )
                continue
            numa = {node: list(ids or ()) for node, ids in (entry.device_ids or {}).items()}
            self._hold(entry.pod_uid, entry.container, entry.resource, Allocation(numa, response))
        for resource in data.registered or {}:
            # Capacity stays 0 until the plugin registers again, and the resource goes
            # after the grace period if it does not.
            state = ResourceState(Endpoint.stopped(resource))
            self.resources[resource] = state
            self._schedule_expiry(resource, state)
        self._devices_changed()
        log.info(
            "checkpoint restored: %d allocations, %d registered resources",
            sum(len(r) for c in self.pod_devices.values() for r in c.values()),
            len(data.registered or {}),
        )
        return None

    # -- shutdown ---------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every endpoint (the checkpoint stays as it is)."""
        self._closed = True
        tasks = []
        for state in self.resources.values():
            self._cancel_expiry(state)
            await state.endpoint.close()
            if state.watch is not None:
                state.watch.cancel()
                tasks.append(state.watch)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
