"""The device plugin of NVIDIA GPUs: one per resource name of an `nvidia:` entry.

Devices are GPU (or MIG device) UUIDs, '<UUID>::<k>' when time-sliced. Allocation
merges each device's edits (NVIDIA_VISIBLE_DEVICES, device nodes, CDI names);
GetPreferredAllocation picks the best-connected GPUs, spreading or packing replicas.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from devplug.config.hardware import DEFAULT_DEV_ROOT
from devplug.config.ids import REPLICA_SEPARATOR
from devplug.config.nvidia import (
    CDI_STRATEGIES,
    cdi_only,
    fails_requests_greater_than_one,
    replicas_of,
    served_name,
)
from devplug.config.resource import ResourceSpec
from devplug.framework import observe
from devplug.framework.device import ContainerEdits, Device
from devplug.framework.plugin import AllocationError
from devplug.framework.preferred import prefer_numa_local, spread_replicas
from devplug.sources.nvidia.cdispec import host_spec, spec_document
from devplug.sources.nvidia.discovery import CDI_KIND, resource_names
from devplug.sources.nvidia.discovery import devices as unit_devices
from devplug.sources.nvidia.extender import Match, Placements
from devplug.sources.nvidia.imex import add_channels, missing_channels
from devplug.sources.nvidia.labels import node_labels
from devplug.sources.nvidia.source import GpuSource
from devplug.sources.nvidia.topology import Links, best_gpus, packed_gpus
from devplug.sources.protocol import SourcePlugin

log = logging.getLogger("devplug.sources.nvidia")

ANSWERED_KEPT = 64  # preferred answers remembered until their Allocate


class NvidiaPlugin(SourcePlugin):
    kind = "nvidia"

    def __init__(self, source: GpuSource, resource: str) -> None:
        super().__init__(served_name(source.spec, resource))
        self.source = source
        self.resource = resource  # the units' resource ('.shared' left out), for labels
        self.replicas = replicas_of(source.spec, resource)
        # `count` as for other resources: how many times each device is served.
        self.spec: ResourceSpec = msgspec.structs.replace(source.resource, count=self.replicas)
        self.nvidia = source.spec
        self.preferred_allocation = self.spec.preferred_allocation
        self.primary = resource == source.name
        # With replicaPolicy extender: the service that finds the pod a request is
        # for, and the pod each preferred answer was for (by its device IDs).
        self.placements: Placements | None = None
        self._answered: dict[frozenset[str], Match] = {}

    @property
    def start_problem(self) -> str:
        """Why `devplug serve` must not start (NVML failing with failOnInitError)."""
        if self.primary and self.nvidia.fail_on_init_error and self.source.problem:
            return (
                f"{self.resource_name}: NVML is not usable: {self.source.problem} "
                "(failOnInitError is set: not waiting for it)"
            )
        if self.primary and self.nvidia.fail_on_init_error and self.source.layout_problem:
            return (
                f"{self.resource_name}: invalid MIG configuration: {self.source.layout_problem} "
                "(failOnInitError is set)"
            )
        if self.primary and cdi_only(self.nvidia) and host_spec(self.nvidia) is None:
            return (
                f"{self.resource_name}: deviceListStrategy "
                f"{','.join(self.nvidia.device_list_strategy)} alone needs the host's NVIDIA "
                f"CDI spec (kind nvidia.com/gpu, from `nvidia-ctk cdi generate`), and "
                f"{', '.join(self.nvidia.cdi_spec_dirs)} have none: a container would get "
                "the GPUs' device nodes but not the driver's libraries; generate it, or add "
                "envvar to deviceListStrategy"
            )
        if self.nvidia.imex_required and (missing := missing_channels(self.nvidia)):
            return (
                f"{self.resource_name}: requested IMEX channel {missing[0]} does not exist "
                "(imex.required is set)"
            )
        return ""

    @property
    def warnings(self) -> list[str]:
        notes = [f"{self.resource_name}: {w}" for w in self.source.warnings] if self.primary else []
        if self.source.problem and self.primary:
            notes.append(f"{self.resource_name}: NVML is not usable: {self.source.problem}")
        return notes + self._setting_notes()

    def _setting_notes(self) -> list[str]:
        """What the settings do otherwise than asked (said by `check`, logged by `serve`)."""
        if not self.primary:
            return []
        notes = []
        extras = [key for key, field in _EXTRAS if getattr(self.nvidia, field)]
        if extras and cdi_only(self.nvidia):
            notes.append(
                f"{self.resource_name}: {', '.join(extras)} with CDI strategies only: the "
                "NVIDIA_* switch is sent, not the CDI device NVIDIA's plugin generates for "
                "it (devplug writes no spec of that component)"
            )
        if not self.nvidia.imex_required:
            notes += [
                f"{self.resource_name}: IMEX channel {path} does not exist: not given"
                for path in missing_channels(self.nvidia)
            ]
        return notes

    def discover(self) -> list[Device]:
        """The devices to serve now, from the source's latest view."""
        return [
            device
            for unit in self.source.units
            if unit.resource == self.resource
            for device in unit_devices(
                unit, self.nvidia, self.source.healthy(unit), self.source.health_reason(unit)
            )
        ]

    async def scan(self) -> None:
        for note in self._setting_notes():
            log.warning("%s", note)
        try:  # attach counts this plugin at once: cancelled while it waits, detach
            await self.source.attach()
            generation = -1
            while True:
                self.publish(self.discover())
                generation = await self.source.wait_changed(generation)
        finally:
            await self.source.detach()

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        nvidia = self.nvidia
        if self.replicas > 1 and len(devices) > 1 and fails_requests_greater_than_one(nvidia):
            if nvidia.sharing == "mps":
                why = (
                    "a container gets one MPS replica (one share of a GPU's memory and "
                    "SMs), as with NVIDIA's plugin unless failRequestsGreaterThanOne is false"
                )
            else:
                why = (
                    f"each GPU is time-sliced {self.replicas} ways and "
                    "failRequestsGreaterThanOne is set, since more replicas do not give a "
                    "container more GPU time"
                )
            raise AllocationError(
                f"{len(devices)} replicas of {self.resource_name} requested by one "
                f"container: {why}; ask for 1"
            )
        if nvidia.replica_policy == "extender":
            await self._check_extender(devices)
        edits = await super().allocate(devices)
        add_channels(edits, nvidia)
        strategies = nvidia.device_list_strategy
        if edits.cdi_devices and "cdi-annotations" in strategies:
            # NVIDIA's key: the prefix, the plugin's name and an ID of this answer.
            key = f"{nvidia.cdi_annotation_prefix}nvidia-device-plugin_{uuid.uuid4()}"
            edits.annotations[key] = ",".join(edits.cdi_devices)
        if "cdi-cri" not in strategies:
            edits.cdi_devices = []
        return edits

    async def preferred(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        policy = self.nvidia.replica_policy
        if policy == "extender":
            return await self._extender(available, must_include, size)
        if self.replicas > 1 and policy in ("distributed", "packed"):
            return self._greedy(available, must_include, size, packed=policy == "packed")
        if any("migProfile" in d.attributes for d in available):
            return prefer_numa_local(available, must_include, size)
        if self.replicas > 1 and policy == "pack":
            return self._pack(available, must_include, size)
        return self._connected(available, must_include, size)

    async def _match(self, size: int) -> Match | None:
        if self.placements is None:
            return None
        return await self.placements.match(self.resource_name, size)

    async def _extender(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> list[str]:
        """The replicas of the GPUs the extender chose for the pod being admitted; where
        no such pod waits (one the extender did not place), packed as `pack` does."""
        match = await self._match(size)
        if match is not None and not must_include:
            by_gpu: dict[str, list[str]] = {}
            for device in sorted(available, key=lambda d: d.id):
                by_gpu.setdefault(_uuid(device), []).append(device.id)
            per_gpu = min(size, self.replicas)
            chosen = [i for gpu in match.gpus for i in by_gpu.get(gpu, [])[:per_gpu]]
            if len(chosen) == size:
                if len(self._answered) >= ANSWERED_KEPT:  # answers never allocated
                    self._answered.clear()
                self._answered[frozenset(chosen)] = match
                return chosen
            log.warning(
                "%s: pod %s: the extender chose GPU %s, which has not %d free replicas "
                "here: the kubelet's choice will be refused",
                self.resource_name,
                match.pod,
                ",".join(match.gpus),
                size,
            )
        return self._pack(available, must_include, size)

    async def _check_extender(self, devices: Sequence[Device]) -> None:
        """Refuse a share that straddles GPUs, and devices on another GPU than the
        extender chose for the pod; mark the pod given otherwise."""
        gpus = sorted({_uuid(d) for d in devices})
        if len(devices) <= self.replicas and len(gpus) > 1:
            self._placed("refused")
            raise AllocationError(
                f"{len(devices)} replicas of {self.resource_name} on {len(gpus)} GPUs "
                f"({', '.join(gpus)}): a share of a GPU is a share of one GPU"
            )
        ids = frozenset(d.id for d in devices)
        match = self._answered.pop(ids, None) or await self._match(len(devices))
        if match is None:
            self._placed("unmatched")
            return
        if set(gpus) != set(match.gpus):
            self._placed("refused")
            raise AllocationError(
                f"pod {match.pod}: the scheduler extender chose GPU {','.join(match.gpus)} "
                f"and the kubelet allocated GPU {','.join(gpus)}: refused, so that the "
                "container never gets another GPU than the one it was placed on"
            )
        self._placed("followed")
        if self.placements is not None:
            self.placements.given(match, gpus)

    def _placed(self, result: str) -> None:
        observe.emit(
            observe.PLACED, self.resource_name, f"extender placement {result}", result=result
        )

    def _connected(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> list[str]:
        """Whole GPUs (or one replica per GPU first) on the best-connected GPUs."""
        by_gpu = _by_gpu(available)
        forced = sorted({_index(d) for d in must_include})
        gpus = best_gpus(sorted(by_gpu), forced, min(size, len(by_gpu)), self._links())
        chosen = {d.id: d for d in must_include}
        pool = [d for g in gpus for d in by_gpu[g] if d.id not in chosen]
        for device in spread_replicas(pool, list(chosen.values())):
            if len(chosen) >= size:
                break
            chosen[device.id] = device
        if len(chosen) < size:  # more replicas than the chosen GPUs hold
            rest = [d for d in available if d.id not in chosen]
            for device in spread_replicas(rest, list(chosen.values()))[: size - len(chosen)]:
                chosen[device.id] = device
        return list(chosen)

    def _greedy(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int, packed: bool
    ) -> list[str]:
        """NVIDIA's shared-device placement: replica by replica, the GPU (or MIG device)
        with the fewest replicas in use (`distributed`; the most: `packed`), then the one
        this answer took fewest from. NVIDIA leaves the rest to its sort; devplug then
        takes the GPU best connected (NVLink, PCIe switch, NUMA) to those already
        chosen, then the lowest ID, so that the answer is stable."""
        unit = _unit_of
        total: dict[str, int] = {}
        for device_id in self.devices:
            total[unit(device_id)] = total.get(unit(device_id), 0) + 1
        gpu = {d.id: _index(d) for d in (*available, *must_include)}
        chosen = [d.id for d in must_include]
        free: dict[str, int] = {}
        candidates = sorted({d.id for d in available} - set(chosen))
        for device_id in candidates:
            free[unit(device_id)] = free.get(unit(device_id), 0) + 1
        picked: dict[str, int] = {}
        sign = -1 if packed else 1
        links = self._links()

        def rank(device_id: str) -> tuple[int, int, tuple[int, ...], str]:
            used = total.get(unit(device_id), 0) - free[unit(device_id)]
            own = gpu[device_id]
            near = [0, 0, 0]
            for other in {gpu[c] for c in chosen} - {own}:
                for k, value in enumerate(links.pair_score(own, other)):
                    near[k] -= value
            return (sign * used, picked.get(unit(device_id), 0), tuple(near), device_id)

        while len(chosen) < size and candidates:
            best = min(candidates, key=rank)
            candidates.remove(best)
            free[unit(best)] -= 1
            picked[unit(best)] = picked.get(unit(best), 0) + 1
            chosen.append(best)
        return chosen

    def _pack(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> list[str]:
        """Replicas on as few GPUs as possible, linked ones when the request spans GPUs
        (`packed_gpus`); the must-include GPUs first, then the busiest GPU's replicas."""
        by_gpu = _by_gpu(available)
        free = {g: len(devices) for g, devices in by_gpu.items()}
        forced = {_index(d) for d in must_include}
        gpus = packed_gpus(free, sorted(forced), size, self._links())
        chosen = {d.id: d for d in must_include}
        for gpu in sorted(gpus, key=lambda g: (g not in forced, free[g], g)):
            for device in by_gpu[gpu]:
                if len(chosen) >= size:
                    return list(chosen)
                chosen.setdefault(device.id, device)
        return list(chosen)

    def _links(self) -> Links:
        view = self.source.view
        if view is None:
            return Links()
        numa = {u.gpu.index: u.numa for u in self.source.units}
        return Links(view.nvlinks, view.ancestors, numa)

    def cdi_spec_place(self) -> tuple[str, Path] | None:
        """With a CDI strategy, every resource of the entry places one spec (the same)."""
        if not any(s in CDI_STRATEGIES for s in self.nvidia.device_list_strategy):
            return None
        return CDI_KIND, Path(self.nvidia.cdi_dir)

    def cdi_spec_document(self) -> dict[str, Any]:
        return spec_document(self.source.units, self.nvidia)

    def node_labels(self) -> Mapping[str, str]:
        return node_labels(self.source, self.resource, self.primary, self.devices.values())


# NVIDIA's switches of driver components: the config key, the spec's field.
_EXTRAS: tuple[tuple[str, str], ...] = (
    ("gdsEnabled", "gds_enabled"),
    ("mofedEnabled", "mofed_enabled"),
    ("gdrcopyEnabled", "gdrcopy_enabled"),
)


def _unit_of(device_id: str) -> str:
    """The GPU or MIG device a replica ID belongs to ('<UUID>::<k>' -> '<UUID>')."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def _uuid(device: Device) -> str:
    """The UUID of the GPU (or MIG device) a device is a replica of."""
    return str(device.attributes.get("uuid", "")) or _unit_of(device.id)


def _index(device: Device) -> int:
    index = device.attributes.get("index", -1)
    return index if isinstance(index, int) else -1


def _by_gpu(devices: Sequence[Device]) -> dict[int, list[Device]]:
    """Devices by GPU index, each GPU's in ID order (the answer must not depend on the
    order the kubelet lists them in)."""
    by_gpu: dict[int, list[Device]] = {}
    for device in sorted(devices, key=lambda d: d.id):
        by_gpu.setdefault(_index(device), []).append(device)
    return by_gpu


def build_plugins(resource: ResourceSpec, dev_root: str = DEFAULT_DEV_ROOT) -> list[NvidiaPlugin]:
    """The plugins of one `nvidia:` entry: its own resource first, then those its GPUs
    are served under (MIG profiles, models), as NVML shows them at start; the driver's
    nodes are on the host under `dev_root`."""
    source = GpuSource(resource, dev_root)
    source.read_now()
    names = resource_names(source.view, resource.name, source.spec)
    return [NvidiaPlugin(source, name) for name in names]
