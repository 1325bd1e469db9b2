"""MIG GPU and compute instances through the fake NVML: profiles, capacity,
placements, creation and destruction by NVML's rules, written back for every process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as _real

from devplug.fakes import gpus as _state
from devplug.fakes.gpumodels import COMPUTE_PLACEMENTS, MigRow
from devplug.fakes.nvml.devices import (
    _compute_multiprocessors,
)
from devplug.fakes.nvml.driver import (
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_DEVICE_MIG_ENABLE,
    NVML_GPU_INSTANCE_PROFILE_COUNT,
    NVML_SUCCESS,
    NVMLError_FunctionNotFound,
    NVMLError_InvalidArgument,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
    T,
    _gpu_instance,
    _handle,
    _instances,
    _key,
    _lock,
    _mig_access,
    _row,
    _save,
    _target,
    _write_through,
)

# -- GPU instances ---------------------------------------------------------------------------


def _mig_gpu(device: Any) -> tuple[int, dict[str, Any]]:
    """(index, GPU) of a GPU handle whose MIG instances are queried: NotSupported unless
    MIG mode is on, NoPermission without the MIG capability."""
    _, entry, mig = _target(device)
    if mig is not None or entry.get("migMode") != NVML_DEVICE_MIG_ENABLE:
        raise NVMLError_NotSupported()
    _mig_access(entry)
    return _key(device)[1], entry


def nvmlDeviceGetGpuInstanceProfileInfo(device: Any, profile: int, version: int = 2) -> Any:
    if version not in (1, 2):
        raise NVMLError_FunctionNotFound()
    _, entry = _mig_gpu(device)
    if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
        raise NVMLError_InvalidArgument()
    row = next((r for r in _state.mig_rows(entry) if r.profile == profile), None)
    if row is None:
        raise NVMLError_NotSupported()
    info = _real.c_nvmlGpuInstanceProfileInfo_v2_t()
    if version == 1:
        info = _real.c_nvmlGpuInstanceProfileInfo_t()
    info.id = row.id
    info.isP2pSupported = 0
    info.sliceCount = row.slices
    info.instanceCount = row.instances
    info.multiprocessorCount = row.multiprocessors
    info.copyEngineCount = row.copy_engines
    info.decoderCount = row.decoders
    info.encoderCount = row.encoders
    info.jpegCount = row.jpegs
    info.ofaCount = row.ofas
    info.memorySizeMB = row.memory_mb
    if version == 2:
        info.name = f"MIG {row.name}".encode()
    return info


def _gi_row(entry: dict[str, Any], profile_id: int) -> MigRow:
    row = next((r for r in _state.mig_rows(entry) if r.id == profile_id), None)
    if row is None:
        raise NVMLError_NotSupported()
    return row


def nvmlDeviceGetGpuInstanceRemainingCapacity(device: Any, profileId: int) -> int:
    _, entry = _mig_gpu(device)
    row = _gi_row(entry, profileId)
    count, taken = 0, list[tuple[int, int]]()
    for start, size in sorted(_state.free_placements(entry, row)):
        if not any(s < start + size and start < s + z for s, z in taken):
            taken.append((start, size))
            count += 1
    used = sum(1 for gi in _state.gpu_instances(entry) if gi["profile"] == row.id)
    return min(count, row.instances - used)


def nvmlDeviceGetGpuInstancePossiblePlacements(
    device: Any, profileId: int, placementsRef: Any, countRef: Any
) -> int:
    """Every placement of the profile, taken or not; placements None: the count only."""
    _, entry = _mig_gpu(device)
    row = _gi_row(entry, profileId)
    if countRef is None:
        raise NVMLError_InvalidArgument()
    _write_through(countRef, len(row.placements))
    if placementsRef is not None:
        if len(placementsRef) < len(row.placements):
            raise NVMLError_InvalidArgument()
        for k, (start, size) in enumerate(row.placements):
            placementsRef[k].start, placementsRef[k].size = start, size
    return int(NVML_SUCCESS)


def _placement(placement: Any) -> tuple[int, int]:
    target = getattr(placement, "_obj", None) or getattr(placement, "contents", placement)
    return int(target.start), int(target.size)


def _change(entry: dict[str, Any], change: Callable[[], T]) -> T:
    """A change of MIG instances: NoPermission without the driver's MIG config
    capability (NVIDIA_MIG_CONFIG_DEVICES in a container); written back for every process."""
    if entry.get("migConfig") is False:
        raise NVMLError_NoPermission()
    with _lock:
        result = change()
        _save()
    return result


def _create_gpu_instance(device: Any, profileId: int, start: int | None) -> Any:
    index, entry = _mig_gpu(device)
    instance = _change(entry, lambda: _state.create_gpu_instance(entry, profileId, start))
    return _handle(("gi", index, instance["id"]))


def nvmlDeviceCreateGpuInstance(device: Any, profileId: int) -> Any:
    return _create_gpu_instance(device, profileId, None)


def nvmlDeviceCreateGpuInstanceWithPlacement(device: Any, profileId: int, placement: Any) -> Any:
    _, entry = _mig_gpu(device)
    start, size = _placement(placement)
    row = _gi_row(entry, profileId)
    if (start, size) not in row.placements:
        raise NVMLError_InvalidArgument()
    return _create_gpu_instance(device, profileId, start)


def nvmlGpuInstanceDestroy(gpuInstance: Any) -> int:
    entry, instance = _gpu_instance(gpuInstance)
    _change(entry, lambda: _state.destroy_gpu_instance(entry, instance["id"]))
    return int(NVML_SUCCESS)


def nvmlDeviceGetGpuInstances(
    device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
) -> int:
    index, entry = _mig_gpu(device)
    row = _gi_row(entry, profileId)
    found = [gi for gi in _state.gpu_instances(entry) if gi["profile"] == row.id]
    if gpuInstancesRef is None or countRef is None:
        raise NVMLError_InvalidArgument()
    for k, instance in enumerate(found):
        gpuInstancesRef[k] = _handle(("gi", index, instance["id"]))
    _write_through(countRef, len(found))
    return int(NVML_SUCCESS)


def nvmlDeviceGetGpuInstanceById(device: Any, gpuInstanceId: int) -> Any:
    index, entry = _mig_gpu(device)
    instance = _state.find_gpu_instance(entry, gpuInstanceId)
    return _handle(("gi", index, instance["id"]))


def nvmlGpuInstanceGetInfo(gpuInstance: Any) -> Any:
    entry, instance = _gpu_instance(gpuInstance)
    _mig_access(entry)
    info = _real.c_nvmlGpuInstanceInfo_t()
    info.device = _handle(("gpu", _key(gpuInstance)[1]))
    info.id = instance["id"]
    info.profileId = instance["profile"]
    info.placement.start, info.placement.size = instance["start"], instance["size"]
    return info


# -- compute instances -----------------------------------------------------------------------


Offered = dict[int, tuple[int, tuple[int, ...]]]  # compute profile -> (slices, starts)


def _offered(entry: dict[str, Any], instance: dict[str, Any]) -> Offered:
    row = _row(entry, instance["profile"])
    return {p: (s, starts) for p, s, starts in COMPUTE_PLACEMENTS.get(row.slices, ())}


def nvmlGpuInstanceGetComputeInstanceProfileInfo(
    device: Any, profile: int, engProfile: int, version: int = 2
) -> Any:
    if version not in (1, 2):
        raise NVMLError_FunctionNotFound()
    entry, instance = _gpu_instance(device)
    _mig_access(entry)
    if not 0 <= profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT or engProfile != 0:
        raise NVMLError_InvalidArgument()
    offered = _offered(entry, instance)
    if profile not in offered:
        raise NVMLError_NotSupported()
    slices, starts = offered[profile]
    row = _row(entry, instance["profile"])
    info = _real.c_nvmlComputeInstanceProfileInfo_v2_t()
    if version == 1:
        info = _real.c_nvmlComputeInstanceProfileInfo_t()
    info.id = profile
    info.sliceCount = slices
    info.instanceCount = len(starts)
    info.multiprocessorCount = _compute_multiprocessors(row, slices)
    info.sharedCopyEngineCount = row.copy_engines
    info.sharedDecoderCount = row.decoders
    info.sharedEncoderCount = row.encoders
    info.sharedJpegCount = row.jpegs
    info.sharedOfaCount = row.ofas
    if version == 2:
        name = row.name if slices == row.slices else f"{slices}c.{row.name}"
        info.name = f"MIG {name}".encode()
    return info


def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gpuInstance: Any, profileId: int) -> int:
    entry, instance = _gpu_instance(gpuInstance)
    offered = _offered(entry, instance)
    if profileId not in offered:
        raise NVMLError_NotSupported()
    size, starts = offered[profileId]
    taken = [(c["start"], c["size"]) for c in instance.get("computeInstances", [])]
    count = 0
    for start in starts:
        if not any(s < start + size and start < s + z for s, z in taken):
            taken.append((start, size))
            count += 1
    return count


def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpuInstance: Any, profileId: int, placementsRef: Any, countRef: Any
) -> int:
    entry, instance = _gpu_instance(gpuInstance)
    offered = _offered(entry, instance)
    if profileId not in offered:
        raise NVMLError_NotSupported()
    if countRef is None:
        raise NVMLError_InvalidArgument()
    size, starts = offered[profileId]
    _write_through(countRef, len(starts))
    if placementsRef is not None:
        if len(placementsRef) < len(starts):
            raise NVMLError_InvalidArgument()
        for k, start in enumerate(starts):
            placementsRef[k].start, placementsRef[k].size = start, size
    return int(NVML_SUCCESS)


def _create_compute_instance(gpuInstance: Any, profileId: int, start: int | None) -> Any:
    entry, instance = _gpu_instance(gpuInstance)
    index = _key(gpuInstance)[1]
    compute = _change(
        entry, lambda: _state.create_compute_instance(entry, instance, profileId, start, index)
    )
    return _handle(("ci", index, instance["id"], compute["id"]))


def nvmlGpuInstanceCreateComputeInstance(gpuInstance: Any, profileId: int) -> Any:
    return _create_compute_instance(gpuInstance, profileId, None)


def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpuInstance: Any, profileId: int, placement: Any
) -> Any:
    entry, instance = _gpu_instance(gpuInstance)
    start, size = _placement(placement)
    offered = _offered(entry, instance)
    if profileId in offered and offered[profileId][0] != size:
        raise NVMLError_InvalidArgument()
    return _create_compute_instance(gpuInstance, profileId, start)


def _compute_instance(handle: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    entry, instance, compute = _instances(handle, "ci")
    assert compute is not None
    return entry, instance, compute


def nvmlComputeInstanceDestroy(computeInstance: Any) -> int:
    entry, instance, compute = _compute_instance(computeInstance)
    _change(entry, lambda: _state.destroy_compute_instance(entry, instance["id"], compute["id"]))
    return int(NVML_SUCCESS)


def nvmlGpuInstanceGetComputeInstances(
    gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
) -> int:
    entry, instance = _gpu_instance(gpuInstance)
    if profileId not in _offered(entry, instance):
        raise NVMLError_NotSupported()
    if computeInstancesRef is None or countRef is None:
        raise NVMLError_InvalidArgument()
    index = _key(gpuInstance)[1]
    found = [c for c in instance.get("computeInstances", []) if c["profile"] == profileId]
    for k, compute in enumerate(found):
        computeInstancesRef[k] = _handle(("ci", index, instance["id"], compute["id"]))
    _write_through(countRef, len(found))
    return int(NVML_SUCCESS)


def nvmlGpuInstanceGetComputeInstanceById(gpuInstance: Any, computeInstanceId: int) -> Any:
    _, instance = _gpu_instance(gpuInstance)
    compute = _state.find_compute_instance(instance, computeInstanceId)
    return _handle(("ci", _key(gpuInstance)[1], instance["id"], compute["id"]))


def nvmlComputeInstanceGetInfo_v2(computeInstance: Any) -> Any:
    entry, instance, compute = _compute_instance(computeInstance)
    _mig_access(entry)
    index = _key(computeInstance)[1]
    info = _real.c_nvmlComputeInstanceInfo_t()
    info.device = _handle(("gpu", index))
    info.gpuInstance = _handle(("gi", index, instance["id"]))
    info.id = compute["id"]
    info.profileId = compute["profile"]
    info.placement.start, info.placement.size = compute["start"], compute["size"]
    return info


def nvmlComputeInstanceGetInfo(computeInstance: Any) -> Any:
    return nvmlComputeInstanceGetInfo_v2(computeInstance)
