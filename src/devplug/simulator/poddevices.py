"""Which devices each container holds (the kubelet's podDevices): per pod, container
and resource its allocation, with the indexes admission reads (the devices in use,
the free ones in listing order) and the checkpoint entries kept in step; and the
runtime options a container's allocations give.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterable, Mapping, Set

from google.protobuf.message import DecodeError

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator import checkpoint
from devplug.simulator.devicestate import Allocation, ResourceState
from devplug.simulator.results import DeviceSpec, KeyValue, Mount, RuntimeOptions

log = logging.getLogger("devplug.simulator.manager")


class PodDevices:
    """The allocations of the node's pods; `writer` (None: in memory only) gets every
    allocation with a response as a checkpoint entry."""

    def __init__(self, writer: checkpoint.CheckpointWriter | None) -> None:
        # pod UID -> container -> resource -> allocation; changed through hold and
        # release only, which keep the indexes below and the checkpoint in step
        self.pods: dict[str, dict[str, dict[str, Allocation]]] = {}
        # resource -> device -> how many allocations (with a response) hold it
        self._in_use: dict[str, collections.Counter[str]] = {}
        # resource -> how many allocations there are (with a response or not)
        self._held: collections.Counter[str] = collections.Counter()
        # resource -> its available devices in listing order, while known
        self._free: dict[str, list[str]] = {}
        self._writer = writer

    def devices_changed(self) -> None:
        """Device lists changed: the free devices are worked out anew."""
        self._free.clear()

    def in_use(self, resource: str) -> set[str]:
        """The devices of `resource` that allocations hold."""
        return set(self._in_use.get(resource, ()))

    def holds(self, resource: str) -> bool:
        """Whether any allocation of `resource` is held."""
        return self._held[resource] > 0

    def container_devices(self, pod_uid: str, container: str) -> dict[str, Allocation]:
        return dict(self.pods.get(pod_uid, {}).get(container, {}))

    def available(self, resource: str, state: ResourceState) -> list[str]:
        """Healthy devices no allocation holds, in the plugin's listing order."""
        free = self._free.get(resource)
        if free is None:
            used: Mapping[str, int] = self._in_use.get(resource) or {}
            free = self._free[resource] = [d for d in state.healthy_ids if d not in used]
        return list(free)

    def hold(self, pod_uid: str, container: str, resource: str, allocation: Allocation) -> None:
        """Record an allocation (replacing the container's earlier one of `resource`)."""
        held = self.pods.setdefault(pod_uid, {}).setdefault(container, {})
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
        if self._writer is not None:
            self._writer.put(
                checkpoint.Entry(
                    pod_uid,
                    container,
                    resource,
                    {node: list(ids) for node, ids in allocation.numa.items()},
                    allocation.response.SerializeToString(deterministic=True),
                )
            )

    def restore(self, entries: Iterable[checkpoint.Entry], known: Set[str]) -> None:
        """Hold the allocations of checkpoint `entries` whose pods are `known` (the
        kubelet releases those of pods that are no longer active)."""
        for entry in entries:
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
            self.hold(entry.pod_uid, entry.container, entry.resource, Allocation(numa, response))

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

    def release(self, pod_uid: str) -> bool:
        """Forget the pod's allocations; False when it has none."""
        containers = self.pods.pop(pod_uid, None)
        if containers is None:
            return False
        for held in containers.values():
            for resource, allocation in held.items():
                self._count_out(resource, allocation)
        if self._writer is not None:
            self._writer.remove_pod(pod_uid)
        return True


def run_options(held: Mapping[str, Allocation]) -> RuntimeOptions:
    """A container's runtime options, merged over its resources (first one wins)."""
    devices: dict[str, DeviceSpec] = {}
    mounts: dict[str, Mount] = {}
    envs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    cdi: dict[str, None] = {}
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
