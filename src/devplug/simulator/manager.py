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

import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from devplug.simulator import checkpoint, topology
from devplug.simulator.devicechoice import devices_to_allocate, preferred, topology_hints
from devplug.simulator.devicestate import (
    ALLOC_BUCKETS,
    AdmissionError,
    Allocation,
    DeviceInfo,
    EventSink,
    Histogram,
    Rejection,
    ResourceState,
)
from devplug.simulator.endpoint import Endpoint, EndpointError
from devplug.simulator.poddevices import PodDevices, run_options
from devplug.simulator.pods import ContainerSpec, PodSpec
from devplug.simulator.resources import ResourceRegistry
from devplug.simulator.results import (
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    RuntimeOptions,
)

__all__ = [
    "ALLOC_BUCKETS",
    "AdmissionError",
    "Allocation",
    "DeviceInfo",
    "DeviceManager",
    "EventSink",
    "Histogram",
    "Rejection",
    "ResourceState",
]

log = logging.getLogger("devplug.simulator.manager")


class DeviceManager:
    """The device manager of one node: its registered resources (a ResourceRegistry),
    what each container holds (PodDevices), admission and the checkpoint."""

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
        self._registry = ResourceRegistry(
            grace_period=grace_period,
            dial_timeout=dial_timeout,
            changed=self._devices_changed,
            save=self.write_checkpoint,
            on_event=on_event or (lambda kind, resource, detail: None),
        )
        self.resources: dict[str, ResourceState] = self._registry.resources
        self.alloc_durations = alloc_durations if alloc_durations is not None else {}
        # pod UID -> container -> the topology manager's choice
        self._affinity: dict[str, dict[str, topology.TopologyHint]] = {}
        # the NUMA nodes the devices report (when not configured)
        self._device_numa_nodes = [0]
        # None: a node kept in memory only, without a checkpoint
        self._checkpoint = (
            checkpoint.CheckpointWriter(checkpoint_path) if checkpoint_path is not None else None
        )
        self._devices = PodDevices(self._checkpoint)
        # pod UID -> container -> resource -> allocation
        self.pod_devices = self._devices.pods

    @property
    def grace_period(self) -> float:
        return self._registry.grace_period

    @property
    def dial_timeout(self) -> float:
        return self._registry.dial_timeout

    @property
    def numa_nodes(self) -> list[int]:
        """The node's NUMA nodes: as configured, else every node a device reports (or 0)."""
        if self._numa_nodes is not None:
            return self._numa_nodes
        return self._device_numa_nodes

    def _devices_changed(self) -> None:
        """Device lists or the set of resources changed: renew what derives from them."""
        self._devices.devices_changed()
        seen = {
            n for state in self.resources.values() for ns in state.topology.values() for n in ns
        }
        self._device_numa_nodes = sorted(seen) or [0]
        if self._checkpoint is not None:
            self._checkpoint.set_registered(
                {resource: state.healthy_ids for resource, state in self.resources.items()}
            )

    # -- registration (the registry's) ------------------------------------------------

    async def register(self, resource: str, socket_path: Path) -> Endpoint:
        """Connect to a registering plugin and make it the resource's endpoint."""
        return await self._registry.register(resource, socket_path)

    async def attach(self, resource: str, endpoint: Endpoint) -> Endpoint:
        """Make a connected `endpoint` the resource's one (a registration after the
        dial; an in-process plugin of a simulated fleet node without one)."""
        return await self._registry.attach(resource, endpoint)

    def grace_left(self, resource: str) -> float | None:
        return self._registry.grace_left(resource)

    # -- allocation state (PodDevices') --------------------------------------------------

    def in_use(self, resource: str) -> set[str]:
        """The devices of `resource` that allocations hold."""
        return self._devices.in_use(resource)

    def is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self.resources or self._devices.holds(resource)

    def container_devices(self, pod_uid: str, container: str) -> dict[str, Allocation]:
        return self._devices.container_devices(pod_uid, container)

    def remove_pod(self, pod_uid: str) -> bool:
        self._affinity.pop(pod_uid, None)
        if not self._devices.release(pod_uid):
            return False
        self.write_checkpoint()
        return True

    def available(self, resource: str) -> list[str]:
        """Healthy devices no allocation holds, in the plugin's listing order."""
        state = self.resources.get(resource)
        return [] if state is None else self._devices.available(resource, state)

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
        return topology_hints(self, container, reusable)

    async def _allocate_container(
        self, pod: PodSpec, container: ContainerSpec, reusable: Mapping[str, Mapping[str, None]]
    ) -> None:
        for resource, needed in container.devices.items():
            if not self.is_device_plugin_resource(resource):
                continue
            ids = await devices_to_allocate(
                resource,
                self.resources.get(resource),
                needed,
                list(reusable.get(resource, {})),
                functools.partial(self.available, resource),
                self._affinity.get(pod.uid, {}).get(container.name),
                functools.partial(preferred, self.resources),
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
            self._devices.hold(
                pod.uid, container.name, resource, Allocation(numa, response.container_responses[0])
            )
            self.write_checkpoint()

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
        return run_options(self.container_devices(pod_uid, container))

    # -- checkpoint ----------------------------------------------------------------------

    def checkpoint_data(self) -> checkpoint.CheckpointData:
        """What the checkpoint holds (and the file, once written)."""
        if self._checkpoint is None:
            return checkpoint.CheckpointData(None, {})
        return self._checkpoint.data()

    def write_checkpoint(self) -> None:
        if self._registry.closed or self._checkpoint is None:
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
        self._devices.restore(data.entries or (), set(known_pods))
        for resource in data.registered or {}:
            # Capacity stays 0 until the plugin registers again, and the resource goes
            # after the grace period if it does not.
            self._registry.restored(resource)
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
        await self._registry.close()
