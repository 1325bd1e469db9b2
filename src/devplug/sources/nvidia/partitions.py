"""MIG through DRA partitions: each GPU already in MIG mode is offered as every MIG
profile at every placement NVML gives it, each a partition that consumes the GPU's
memory slices (and its memory, and one of a profile's instances where NVML allows
fewer than it has placements). The scheduler never allocates overlapping ones; the
GPU and compute instance are made when a claim is prepared and destroyed when it is
unprepared. devplug never changes a GPU's MIG mode: a GPU with MIG off is offered
whole.

Instances that exist when devplug starts and that no prepared claim explains were
made by someone else: the placements they overlap are not offered, and they are left
alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from devplug.framework.device import Attribute, ContainerEdits, Device
from devplug.framework.dra.layout import Layout, Partition, partition_id
from devplug.kube.dranames import device_name
from devplug.sources.nvidia import blocking
from devplug.sources.nvidia.discovery import devices as unit_devices
from devplug.sources.nvidia.discovery import units
from devplug.sources.nvidia.mig import MIB, GpuInstanceProfile, MigGeometry, Placement

if TYPE_CHECKING:
    from devplug.framework.dra.driver import ClaimRef
    from devplug.sources.nvidia.nvml import Nvml
    from devplug.sources.nvidia.plugin import NvidiaPlugin

log = logging.getLogger("devplug.sources.nvidia.partitions")

_NOT_LABEL = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class MigPartition:
    """What a partition's device ID stands for."""

    gpu: str  # the GPU's UUID
    profile: GpuInstanceProfile
    placement: Placement


def partition_name(profile: GpuInstanceProfile, placement: Placement) -> str:
    """'mig-1g-10gb-me-3': a DNS label for a profile at a placement."""
    return f"mig-{_NOT_LABEL.sub('-', profile.name.lower()).strip('-')}-{placement.start}"


def mig_layout(
    geometry: MigGeometry, memory: int, foreign: Sequence[Placement] = ()
) -> tuple[Layout, dict[str, tuple[GpuInstanceProfile, Placement]]]:
    """The partitions of one GPU in MIG mode, leaving out placements that overlap
    `foreign` instances; and what each partition name stands for."""
    counters = {f"memory-slice-{i}": 1 for i in range(geometry.memory_slices)}
    counters["memory"] = memory
    partitions: list[Partition] = []
    meaning: dict[str, tuple[GpuInstanceProfile, Placement]] = {}
    for profile in geometry.profiles:
        limited = profile.instances < len(profile.placements)
        if limited:
            counters[f"profile-{profile.id}"] = profile.instances
        for placement in profile.placements:
            if any(placement.overlaps(f) for f in foreign):
                continue
            consumes = {f"memory-slice-{i}": 1 for i in placement.slices}
            consumes["memory"] = profile.memory_mb * MIB
            if limited:
                consumes[f"profile-{profile.id}"] = 1
            name = partition_name(profile, placement)
            attributes: dict[str, Attribute] = {
                "migProfile": profile.name,
                "migPlacement": placement.start,
                "memory": profile.memory_mb * MIB,
                "multiprocessors": profile.multiprocessors,
            }
            partitions.append(Partition(name, consumes, attributes))
            meaning[name] = (profile, placement)
    return Layout(counters, tuple(partitions)), meaning


class MigPartitions:
    """The DRA hooks of an NVIDIA plugin with `dra.partitions.mig`: layouts from each
    GPU's MIG geometry, MIG instances made at prepare and destroyed at unprepare.
    `held` names the devices prepared for claims now (the driver's)."""

    def __init__(self, plugin: NvidiaPlugin, held: Callable[[], Set[str]]) -> None:
        self.plugin = plugin
        self.held = held
        self.timeout = plugin.nvidia.nvml_timeout_seconds
        self._nvml: Nvml | None = None
        self._layouts: dict[str, Layout | None] = {}  # GPU UUID -> its layout
        self._partitions: dict[str, MigPartition] = {}  # partition device ID ->
        self._indices: dict[str, int] = {}  # GPU UUID -> NVML index
        self._lock = asyncio.Lock()

    # -- layouts -------------------------------------------------------------------------

    def layout(self, device: Device) -> Layout | None:
        uuid = device.attributes.get("uuid")
        if not isinstance(uuid, str) or "migProfile" in device.attributes:
            return None
        if uuid not in self._layouts:
            self._layouts[uuid] = self._read_layout(device, uuid)
        return self._layouts[uuid]

    def _read_layout(self, device: Device, uuid: str) -> Layout | None:
        unit = next((u for u in self.plugin.source.units if u.uuid == uuid), None)
        if unit is None or not unit.gpu.mig_enabled:
            return None
        try:
            geometry = blocking.call_sync(
                lambda: self._read(unit.gpu.index), self.timeout, "MIG geometry"
            )
        except Exception as error:
            log.warning("GPU %s: MIG profiles unreadable (%s): offered whole", uuid, error)
            return None
        held = self.held()
        foreign = []
        for instance in geometry.instances:
            profile = next(p for p in geometry.profiles if p.id == instance.profile_id)
            name = device_name(partition_id(device.id, partition_name(profile, instance.placement)))
            if name not in held:
                foreign.append(instance.placement)
        if foreign:
            log.warning(
                "GPU %s: %d MIG instance(s) devplug did not make: their placements are not offered",
                uuid,
                len(foreign),
            )
        memory = device.attributes.get("memory")
        layout, meaning = mig_layout(geometry, memory if isinstance(memory, int) else 0, foreign)
        for name, (profile, placement) in meaning.items():
            self._partitions[partition_id(device.id, name)] = MigPartition(uuid, profile, placement)
        self._indices[uuid] = unit.gpu.index
        return layout

    def _started(self) -> Nvml:
        if self._nvml is None:
            from devplug.sources.nvidia.nvml import Nvml

            nvml = Nvml()
            nvml.start()
            nvml.read()
            self._nvml = nvml
        return self._nvml

    def _read(self, index: int) -> MigGeometry:
        return self._started().mig_geometry(index)

    # -- prepare, unprepare ----------------------------------------------------------------

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        """Make the MIG instances of the claim's partitions; the containers get the MIG
        devices (capability nodes, NVIDIA_VISIBLE_DEVICES) and any whole GPU."""
        chosen: list[Device] = []
        async with self._lock:
            for device in devices:
                part = self._partitions.get(device.id)
                if part is None:
                    chosen.append(device)
                    continue
                chosen.append(await blocking.call(partial(self._make, part), self.timeout, "MIG"))
        return await self.plugin.allocate(chosen)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        async with self._lock:
            for device in devices:
                part = self._partitions.get(device.id)
                if part is not None:
                    await blocking.call(partial(self._remove, part), self.timeout, "MIG")

    def _existing(self, nvml: Nvml, part: MigPartition) -> int | None:
        """The GPU instance of `part` if it exists (made before a restart)."""
        geometry = nvml.mig_geometry(self._indices[part.gpu])
        for instance in geometry.instances:
            if instance.profile_id == part.profile.id and instance.placement == part.placement:
                return instance.id
        return None

    def _make(self, part: MigPartition) -> Device:
        """Create the partition's instances (unless they exist) and the Device of the MIG
        device, with its capability nodes and env."""
        nvml = self._started()
        index = self._indices[part.gpu]
        where = f"MIG {part.profile.name} at memory slice {part.placement.start} of GPU {part.gpu}"
        gpu_instance = self._existing(nvml, part)
        if gpu_instance is None:
            try:
                gpu_instance = nvml.create_mig(index, part.profile, part.placement)
            except nvml.Error as error:
                raise RuntimeError(f"{where}: cannot be made: {type(error).__name__}") from None
            log.info("%s: made (GPU instance %d)", where, gpu_instance)
        view = nvml.read()
        spec = msgspec.structs.replace(self.plugin.nvidia, mig_strategy="mixed")
        found, _ = units(view, self.plugin.resource_name, spec, self.plugin.source.dev_root)
        for unit in found:
            mig = unit.mig
            if unit.gpu.uuid == part.gpu and mig is not None and mig.gpu_instance == gpu_instance:
                return unit_devices(unit, self.plugin.nvidia, True)[0]
        raise RuntimeError(f"{where}: made, but NVML lists no MIG device for it")

    def _remove(self, part: MigPartition) -> None:
        nvml = self._started()
        gpu_instance = self._existing(nvml, part)
        if gpu_instance is not None:
            nvml.destroy_mig(self._indices[part.gpu], gpu_instance)
            log.info(
                "MIG %s at memory slice %d of GPU %s: destroyed",
                part.profile.name,
                part.placement.start,
                part.gpu,
            )
