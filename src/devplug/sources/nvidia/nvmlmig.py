"""NVML's MIG management: the GPU's instance profiles, where each may be placed, the
GPU and compute instances that exist, and making and removing them."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from devplug.sources.nvidia.mig import (
    COMPUTE_INSTANCE_PROFILES,
    ComputeInstance,
    GpuInstance,
    GpuInstanceProfile,
    MigGeometry,
    Placement,
    profile_name,
)


class NvmlMig:
    """The MIG side of `Nvml`: its library and the handles of its last `read`."""

    lib: Any
    Error: type[Exception]
    _handles: list[Any]

    def _gpu_profile_ids(self, handle: Any) -> dict[int, int]:
        """Profile ID -> NVML_GPU_INSTANCE_PROFILE_* of the GPU's profiles."""
        ids: dict[int, int] = {}
        for enum, info in self._gpu_profiles(handle):
            ids[int(info.id)] = enum
        return ids

    def _gpu_profiles(self, handle: Any) -> list[tuple[int, Any]]:
        lib = self.lib
        found = []
        for enum in range(int(lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                found.append((enum, lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)))
            except (
                lib.NVMLError_NotSupported,
                lib.NVMLError_InvalidArgument,
                lib.NVMLError_FunctionNotFound,
            ):
                continue
        return found

    def mig_geometry(self, index: int) -> MigGeometry:
        """The MIG profiles of GPU `index` (by its index in the last `read`), where each
        may be placed, and the GPU and compute instances that exist: what a DRA
        partitions publisher builds its counters and devices from. Raises NVML's errors
        (NotSupported: MIG mode is off or the GPU has none; NoPermission: no MIG
        capability)."""
        lib = self.lib
        handle = self._handles[index]
        total = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        current, _pending = lib.nvmlDeviceGetMigMode(handle)
        if current != lib.NVML_DEVICE_MIG_ENABLE:
            raise lib.NVMLError_NotSupported()  # what NVML answers for profiles then
        profiles: list[GpuInstanceProfile] = []
        instances: list[GpuInstance] = []
        for enum, info in self._gpu_profiles(handle):
            pid = int(info.id)
            count = ctypes.c_uint()
            lib.nvmlDeviceGetGpuInstancePossiblePlacements(handle, pid, None, ctypes.byref(count))
            array = (lib.c_nvmlGpuInstancePlacement_t * count.value)()
            lib.nvmlDeviceGetGpuInstancePossiblePlacements(handle, pid, array, ctypes.byref(count))
            profiles.append(
                GpuInstanceProfile(
                    profile=enum,
                    id=pid,
                    name=profile_name(enum, None, int(info.memorySizeMB), total),
                    slices=int(info.sliceCount),
                    instances=int(info.instanceCount),
                    memory_mb=int(info.memorySizeMB),
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpegs=int(info.jpegCount),
                    ofas=int(info.ofaCount),
                    placements=tuple(
                        Placement(int(p.start), int(p.size)) for p in array[: count.value]
                    ),
                )
            )
            instances += self._gpu_instances(handle, pid, total, profiles[-1])
        return MigGeometry(
            index=index,
            uuid=text(lib.nvmlDeviceGetUUID(handle)),
            profiles=tuple(profiles),
            instances=tuple(sorted(instances, key=lambda i: i.id)),
        )

    def create_mig(self, index: int, profile: GpuInstanceProfile, placement: Placement) -> int:
        """A GPU instance of `profile` at `placement` on GPU `index`, with one compute
        instance over all of it (`nvidia-smi mig -cgi <profile>:<start> -C`); its GPU
        instance ID. NVML's errors are raised (InsufficientResources: the placement is
        taken); a GPU instance whose compute instance cannot be made is destroyed."""
        lib = self.lib
        handle = self._handles[index]
        spot = lib.c_nvmlGpuInstancePlacement_t()
        spot.start, spot.size = placement.start, placement.size
        gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, ctypes.byref(spot))
        try:
            whole = [
                info
                for enum, info in self._compute_profiles(gi)
                if COMPUTE_INSTANCE_PROFILES.get(enum) == profile.slices
            ]
            if not whole:
                raise lib.NVMLError_NotSupported()
            lib.nvmlGpuInstanceCreateComputeInstance(gi, int(whole[0].id))
        except BaseException:
            with contextlib.suppress(self.Error):
                lib.nvmlGpuInstanceDestroy(gi)
            raise
        return int(lib.nvmlGpuInstanceGetInfo(gi).id)

    def destroy_mig(self, index: int, gpu_instance: int) -> None:
        """Destroy a GPU instance of GPU `index` and its compute instances (`-dci`, then
        `-dgi`); one that is gone already is fine."""
        lib = self.lib
        handle = self._handles[index]
        try:
            gi = lib.nvmlDeviceGetGpuInstanceById(handle, gpu_instance)
        except lib.NVMLError_NotFound:
            return
        for _, info in self._compute_profiles(gi):
            count = ctypes.c_uint()
            array = (lib.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            lib.nvmlGpuInstanceGetComputeInstances(gi, int(info.id), array, ctypes.byref(count))
            for ci in array[: count.value]:
                lib.nvmlComputeInstanceDestroy(ci)
        lib.nvmlGpuInstanceDestroy(gi)

    def _compute_profiles(self, gi: Any) -> list[tuple[int, Any]]:
        """(NVML_COMPUTE_INSTANCE_PROFILE_*, its info) of the profiles a GPU instance offers."""
        lib = self.lib
        found = []
        for enum in range(int(lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                found.append(
                    (
                        enum,
                        lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gi, enum, lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        ),
                    )
                )
            except (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument):
                continue
        return found

    def _gpu_instances(
        self, handle: Any, pid: int, total: int, profile: GpuInstanceProfile
    ) -> list[GpuInstance]:
        lib = self.lib
        count = ctypes.c_uint()
        array = (lib.c_nvmlGpuInstance_t * max(profile.instances, 1))()
        lib.nvmlDeviceGetGpuInstances(handle, pid, array, ctypes.byref(count))
        found = []
        for gi in array[: count.value]:
            info = lib.nvmlGpuInstanceGetInfo(gi)
            computes = []
            for ci_enum in range(int(lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                try:
                    ci_info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, ci_enum, lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                except (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument):
                    continue
                ci_count = ctypes.c_uint()
                ci_array = (lib.c_nvmlComputeInstance_t * max(int(ci_info.instanceCount), 1))()
                lib.nvmlGpuInstanceGetComputeInstances(
                    gi, int(ci_info.id), ci_array, ctypes.byref(ci_count)
                )
                for ci in ci_array[: ci_count.value]:
                    ci_data = lib.nvmlComputeInstanceGetInfo(ci)
                    slices = int(ci_info.sliceCount)
                    computes.append(
                        ComputeInstance(
                            id=int(ci_data.id),
                            profile_id=int(ci_data.profileId),
                            start=int(ci_data.placement.start),
                            slices=slices,
                            name=profile_name(profile.profile, slices, profile.memory_mb, total),
                        )
                    )
            found.append(
                GpuInstance(
                    id=int(info.id),
                    profile_id=int(info.profileId),
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    compute_instances=tuple(sorted(computes, key=lambda c: c.id)),
                )
            )
        return found


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# The plain GPU instance profile of a slice count, for drivers that cannot say which.
_PLAIN_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def enum_for(enum: int | None, slices: int) -> int:
    return enum if enum is not None else _PLAIN_PROFILE.get(slices, 0x0)
