"""A fake NVML driver for tests and benchmarks on machines without an NVIDIA GPU.

It is a drop-in for the `pynvml` functions devplug uses (and those that create MIG
instances, as mig-parted and `nvidia-smi mig` do), with their signatures, return types
(pynvml's ctypes structures and handles) and pynvml's own error classes, raised where
nvml.h says the real library returns them, so the code under test cannot tell it from a
driver. A daemon loads it in place of pynvml when
`DEVPLUG_NVML_MODULE=devplug.testing.fakenvml`; it reads the host it pretends to be from
the JSON file named by `DEVPLUG_FAKE_NVML` (see `devplug.testing.fakegpus`), again
whenever the file changes, and writes MIG instances it creates back to it, as the driver
keeps them for every process.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvml as _real

from devplug.ground.files import write_atomic
from devplug.testing import fakegpus as _state
from devplug.testing.fakegpus import (
    DESCRIPTION_ENV,
    MODULE,
    FakeGpuHost,
    eight_gpus,
    fake_host,
    gpu,
    gpu_uuid,
    mig_layout,
    mig_uuid,
)
from devplug.testing.gpumodels import COMPUTE_PLACEMENTS, MigRow, model

__all__ = [
    "DESCRIPTION_ENV",
    "MODULE",
    "FakeGpuHost",
    "eight_gpus",
    "fake_host",
    "gpu",
    "gpu_uuid",
    "mig_layout",
    "mig_uuid",
]

POLL_S = 0.005  # how often a blocked call looks at the description again

# pynvml's errors, constants and types, re-exported: the caller's `except` clauses and
# comparisons see the real ones.
NVMLError = _real.NVMLError
NVMLError_Uninitialized = _real.NVMLError_Uninitialized
NVMLError_NotSupported = _real.NVMLError_NotSupported
NVMLError_NotFound = _real.NVMLError_NotFound
NVMLError_InvalidArgument = _real.NVMLError_InvalidArgument
NVMLError_DriverNotLoaded = _real.NVMLError_DriverNotLoaded
NVMLError_LibraryNotFound = _real.NVMLError_LibraryNotFound
NVMLError_NoPermission = _real.NVMLError_NoPermission
NVMLError_Timeout = _real.NVMLError_Timeout
NVMLError_GpuIsLost = _real.NVMLError_GpuIsLost
NVMLError_FunctionNotFound = _real.NVMLError_FunctionNotFound
NVML_DEVICE_MIG_ENABLE = _real.NVML_DEVICE_MIG_ENABLE
NVML_DEVICE_MIG_DISABLE = _real.NVML_DEVICE_MIG_DISABLE
NVML_NVLINK_MAX_LINKS = _real.NVML_NVLINK_MAX_LINKS
NVML_FEATURE_ENABLED = _real.NVML_FEATURE_ENABLED
NVML_COMPUTEMODE_DEFAULT = _real.NVML_COMPUTEMODE_DEFAULT
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = _real.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
NVML_GPU_INSTANCE_PROFILE_COUNT = _real.NVML_GPU_INSTANCE_PROFILE_COUNT
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = _real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = _real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError
nvmlEventTypeDoubleBitEccError = _real.nvmlEventTypeDoubleBitEccError
nvmlEventTypeSingleBitEccError = _real.nvmlEventTypeSingleBitEccError
c_nvmlDevice_t = _real.c_nvmlDevice_t
c_nvmlGpuFabricInfo_t = _real.c_nvmlGpuFabricInfo_t
NVML_GPU_FABRIC_STATE_COMPLETED = _real.NVML_GPU_FABRIC_STATE_COMPLETED
c_nvmlEventSet_t = _real.c_nvmlEventSet_t
c_nvmlGpuInstance_t = _real.c_nvmlGpuInstance_t
c_nvmlComputeInstance_t = _real.c_nvmlComputeInstance_t
c_nvmlGpuInstancePlacement_t = _real.c_nvmlGpuInstancePlacement_t
c_nvmlComputeInstancePlacement_t = _real.c_nvmlComputeInstancePlacement_t

EVENT_TYPES = {
    "xid": nvmlEventTypeXidCriticalError,
    "dbe": nvmlEventTypeDoubleBitEccError,
    "sbe": nvmlEventTypeSingleBitEccError,
}
ALL_EVENTS = sum(EVENT_TYPES.values())
ALL_INSTANCES = 0xFFFFFFFF

_lock = threading.RLock()
_description: dict[str, Any] = {}
_seen: tuple[int, int, int] | None = None
_init_count = 0
_structs: dict[tuple[Any, ...], Any] = {}  # handle key -> the handle's target
_handles: dict[int, tuple[Any, ...]] = {}  # handle address -> key
_event_sets: dict[int, dict[str, Any]] = {}  # event set address -> its state

Key = tuple[Any, ...]
T = TypeVar("T")


# -- the description ---------------------------------------------------------------------


def _load() -> dict[str, Any]:
    """The description, read again when its file changed."""
    global _description, _seen
    path = os.environ.get(DESCRIPTION_ENV)
    if not path:
        raise NVMLError_LibraryNotFound()
    with _lock:
        try:
            info = os.stat(path)
        except OSError:
            raise NVMLError_LibraryNotFound() from None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key != _seen:
            _description = json.loads(Path(path).read_text())
            _description.setdefault("events", _description.pop("xids", []))
            _seen = key
        return _description


def _save() -> None:
    """Write MIG changes back, so that every process sees the driver's state."""
    global _seen
    path = os.environ[DESCRIPTION_ENV]
    with _lock:
        write_atomic(path, json.dumps(_description, indent=1))
        info = os.stat(path)
        _seen = (info.st_ino, info.st_mtime_ns, info.st_size)


def _driver() -> dict[str, Any]:
    """The description once the driver answers: blocks while it 'hangs'."""
    while True:
        description = _load()
        if not description.get("driver", {}).get("hang", False):
            return description
        time.sleep(POLL_S)


def _error(name: str) -> Exception:
    """pynvml's error class of that name ('GpuIsLost'), made."""
    error: Exception = getattr(_real, f"NVMLError_{name}")()
    return error


def _initialized() -> dict[str, Any]:
    description = _driver()
    if _init_count <= 0:
        raise NVMLError_Uninitialized()
    return description


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _key(handle: Any) -> Key:
    key = _handles.get(_address(handle))
    if key is None:
        raise NVMLError_InvalidArgument()
    return key


def _entry(description: dict[str, Any], index: int) -> dict[str, Any]:
    gpus = description["gpus"]
    if index >= len(gpus):
        raise NVMLError_GpuIsLost()
    entry: dict[str, Any] = gpus[index]
    if entry.get("lost", False):
        raise NVMLError_GpuIsLost()
    return entry


def _target(
    handle: Any,
) -> tuple[dict[str, Any], dict[str, Any], tuple[dict[str, Any], dict[str, Any]] | None]:
    """(description, GPU, (GPU instance, compute instance) of a MIG device or None);
    GpuIsLost when the GPU is lost, InvalidArgument for a handle that no longer is."""
    description = _initialized()
    key = _key(handle)
    if key[0] not in ("gpu", "mig"):
        raise NVMLError_InvalidArgument()
    entry = _entry(description, key[1])
    if key[0] == "gpu":
        return description, entry, None
    return description, entry, _mig_pair(entry, key[2], key[3])


def _mig_pair(entry: dict[str, Any], gi: int, ci: int) -> tuple[dict[str, Any], dict[str, Any]]:
    for pair in _state.mig_devices(entry):
        if pair[0]["id"] == gi and pair[1]["id"] == ci:
            return pair
    raise NVMLError_InvalidArgument()  # destroyed: the handle is no longer valid


def _handle(key: Key) -> Any:
    with _lock:
        target = _structs.get(key)
        if target is None:
            struct = {
                "gi": _real.struct_c_nvmlGpuInstance_t,
                "ci": _real.struct_c_nvmlComputeInstance_t,
            }.get(key[0], _real.struct_c_nvmlDevice_t)
            target = _structs[key] = struct()
            _handles[ctypes.addressof(target)] = key
    return ctypes.pointer(target)


def _instances(
    handle: Any, kind: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(GPU, GPU instance, compute instance or None) of a GPU (`kind` 'gi') or compute
    ('ci') instance handle; InvalidArgument once the instance was destroyed."""
    description = _initialized()
    key = _key(handle)
    if key[0] != kind:
        raise NVMLError_InvalidArgument()
    entry = _entry(description, key[1])
    try:
        instance = _state.find_gpu_instance(entry, key[2])
        compute = _state.find_compute_instance(instance, key[3]) if kind == "ci" else None
    except NVMLError_NotFound:
        raise NVMLError_InvalidArgument() from None
    return entry, instance, compute


def _gpu_instance(handle: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    entry, instance, _ = _instances(handle, "gi")
    return entry, instance


def _row(entry: dict[str, Any], profile_id: int) -> MigRow:
    return next(r for r in _state.mig_rows(entry) if r.id == profile_id)


def _mig_access(entry: dict[str, Any]) -> None:
    """MIG queries need the driver's MIG monitor capability (NVIDIA_MIG_MONITOR_DEVICES
    in a container): without it NVML answers NoPermission."""
    if entry.get("migAccess") is False:
        raise NVMLError_NoPermission()


def _write_through(ref: Any, value: Any) -> None:
    """Set the c_uint behind `byref(...)` or a pointer."""
    target = getattr(ref, "_obj", None)
    if target is None:
        target = ref.contents
    target.value = value


# -- system --------------------------------------------------------------------------------


def nvmlInit() -> None:
    global _init_count
    description = _driver()
    driver = description.get("driver", {})
    if driver.get("library") is False:
        raise NVMLError_LibraryNotFound()
    if not driver.get("loaded", True):
        raise NVMLError_DriverNotLoaded()
    if driver.get("initError"):
        raise _error(driver["initError"])
    with _lock:
        _init_count += 1


def nvmlShutdown() -> None:
    global _init_count
    with _lock:
        if _init_count <= 0:
            raise NVMLError_Uninitialized()
        _init_count -= 1


def nvmlSystemGetDriverVersion() -> str:
    return str(_initialized().get("driver", {}).get("version", "550.54.15"))


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_initialized().get("driver", {}).get("cuda", 12040))


def nvmlDeviceGetCount() -> int:
    return len(_initialized()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> Any:
    """InvalidArgument past the count; GpuIsLost; the errors nvml.h lists for a GPU the
    process cannot use (NoPermission, InsufficientPower, IrqIssue, Unknown) as 'error'."""
    gpus = _initialized()["gpus"]
    if not 0 <= index < len(gpus):
        raise NVMLError_InvalidArgument()
    entry = _entry({"gpus": gpus}, index)
    if entry.get("error"):
        raise _error(entry["error"])
    return _handle(("gpu", index))


def nvmlDeviceGetHandleByUUID(uuid: Any) -> Any:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    description = _initialized()
    for index, entry in enumerate(description["gpus"]):
        if entry["uuid"] == text:
            _entry(description, index)
            return _handle(("gpu", index))
        for gi, ci in _state.mig_devices(entry):
            if ci["uuid"] == text:
                _entry(description, index)
                return _handle(("mig", index, gi["id"], ci["id"]))
    raise NVMLError_NotFound()


# -- devices -------------------------------------------------------------------------------


def nvmlDeviceGetUUID(handle: Any) -> str:
    _, entry, mig = _target(handle)
    return str(mig[1]["uuid"] if mig else entry["uuid"])


def _mig_name(entry: dict[str, Any], gi: dict[str, Any], ci: dict[str, Any]) -> str:
    row = _row(entry, gi["profile"])
    if ci["size"] == row.slices:
        return row.name
    return f"{ci['size']}c.{row.name}"


def nvmlDeviceGetName(handle: Any) -> str:
    _, entry, mig = _target(handle)
    name = str(entry["name"])
    if mig is not None:
        name += f" MIG {_mig_name(entry, *mig)}"
    return name


def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> Any:
    _, entry, mig = _target(handle)
    if mig is not None:
        total = _row(entry, mig[0]["profile"]).memory_mb * 1024 * 1024
    else:
        total = int(entry["memory"])
    return _real.c_nvmlMemory_t(total=total, free=total, used=0)


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    _, entry, _ = _target(handle)
    major, minor = entry.get("cc", [9, 0])
    return (int(major), int(minor))


def nvmlDeviceGetPciInfo(handle: Any) -> Any:
    _, entry, _ = _target(handle)
    bus = str(entry["busId"]).encode()
    info = _real.nvmlPciInfo_t()
    info.busId = bus
    info.busIdLegacy = bus[:16]
    domain, bus_number, rest = str(entry["busId"]).split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus_number, 16), int(rest[:2], 16)
    info.pciDeviceId = (int(entry.get("deviceId", 0x2330)) << 16) | 0x10DE
    return info


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    _, entry, _ = _target(handle)
    return int(entry["minor"])


def nvmlDeviceGetPersistenceMode(handle: Any) -> int:
    """NVML_FEATURE_ENABLED unless the GPU says 'persistence': false."""
    _, entry, _ = _target(handle)
    return int(bool(entry.get("persistence", True)))


def nvmlDeviceGetGpuFabricInfo(device: Any, gpuFabricInfo: Any) -> int:
    """A GPU's NVLink fabric (`fabric: {clusterUuid, cliqueId, state, status}`, as on a
    GB200 NVL rack); NotSupported for a GPU without one, as NVML answers before Hopper."""
    _, entry, _ = _target(device)
    fabric = entry.get("fabric")
    if fabric is None:
        raise NVMLError_NotSupported()
    info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)  # byref(struct), as C takes it
    raw = bytes.fromhex(str(fabric["clusterUuid"]).replace("-", ""))
    ctypes.memmove(ctypes.addressof(info.clusterUuid), raw, len(raw))
    info.cliqueId = int(fabric.get("cliqueId", 0))
    info.state = int(fabric.get("state", NVML_GPU_FABRIC_STATE_COMPLETED))
    info.status = int(fabric.get("status", 0))
    return 0


def nvmlDeviceGetComputeMode(handle: Any) -> int:
    _, entry, _ = _target(handle)
    return int(entry.get("computeMode", NVML_COMPUTEMODE_DEFAULT))


def nvmlDeviceSetComputeMode(handle: Any, mode: int) -> None:
    """InvalidArgument for a mode NVML does not have; NoPermission where the GPU says
    so ('computeModeLocked': not root); written back, as the driver keeps it."""
    _, entry, mig = _target(handle)
    if mig is not None or not 0 <= int(mode) < _real.NVML_COMPUTEMODE_COUNT:
        raise NVMLError_InvalidArgument()
    if entry.get("computeModeLocked"):
        raise NVMLError_NoPermission()
    with _lock:
        entry["computeMode"] = int(mode)
        _save()


def nvmlDeviceGetFieldValues(handle: Any, fieldIds: Any) -> Any:
    """Only the GPU's recovery action is known; other fields answer NotSupported in their
    own nvmlReturn, as NVML does for a field a GPU lacks."""
    _, entry, _ = _target(handle)
    values = (_real.c_nvmlFieldValue_t * len(fieldIds))()
    for value, field_id in zip(values, fieldIds, strict=True):
        value.fieldId = field_id
        action = entry.get("recoveryAction", 0)
        if field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and action is not None:
            value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
            value.value.uiVal = int(action)
            value.nvmlReturn = NVML_SUCCESS
        else:
            value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


# -- MIG devices -----------------------------------------------------------------------------


def nvmlDeviceGetMigMode(device: Any) -> list[int]:
    _, entry, mig = _target(device)
    if mig is not None or entry.get("migMode") is None:
        raise NVMLError_NotSupported()
    return [int(entry["migMode"]), int(entry.get("migPending", entry["migMode"]))]


def nvmlDeviceGetMaxMigDeviceCount(device: Any) -> int:
    """Zero unless MIG is supported and enabled (nvml.h)."""
    _, entry, _ = _target(device)
    if entry.get("migMode") != NVML_DEVICE_MIG_ENABLE or entry.get("model") is None:
        return 0
    return int(model(entry["model"]).max_mig_devices)


def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> Any:
    _, entry, mig = _target(device)
    if mig is not None or entry.get("migMode") != NVML_DEVICE_MIG_ENABLE:
        raise NVMLError_NotSupported()
    _mig_access(entry)
    if not 0 <= index < nvmlDeviceGetMaxMigDeviceCount(device):
        raise NVMLError_InvalidArgument()
    devices = _state.mig_devices(entry)
    if index >= len(devices):
        raise NVMLError_NotFound()
    gi, ci = devices[index]
    return _handle(("mig", _key(device)[1], gi["id"], ci["id"]))


def nvmlDeviceIsMigDeviceHandle(device: Any) -> Any:
    _, _, mig = _target(device)
    return ctypes.c_uint(int(mig is not None))


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: Any) -> Any:
    _, _, mig = _target(migDevice)
    if mig is None:
        raise NVMLError_NotSupported()
    return _handle(("gpu", _key(migDevice)[1]))


def nvmlDeviceGetAttributes(device: Any) -> Any:
    _, entry, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    _mig_access(entry)
    gi, ci = mig
    row = _row(entry, gi["profile"])
    attributes = _real.c_nvmlDeviceAttributes()
    attributes.gpuInstanceSliceCount = row.slices
    attributes.computeInstanceSliceCount = ci["size"]
    attributes.memorySizeMB = row.memory_mb
    attributes.multiprocessorCount = _compute_multiprocessors(row, ci["size"])
    attributes.sharedCopyEngineCount = row.copy_engines
    attributes.sharedDecoderCount = row.decoders
    attributes.sharedEncoderCount = row.encoders
    attributes.sharedJpegCount = row.jpegs
    attributes.sharedOfaCount = row.ofas
    return attributes


def nvmlDeviceGetAttributes_v2(device: Any) -> Any:
    return nvmlDeviceGetAttributes(device)


def _compute_multiprocessors(row: MigRow, slices: int) -> int:
    if slices == row.slices:
        return row.multiprocessors
    return row.multiprocessors * slices // row.slices


def nvmlDeviceGetGpuInstanceId(device: Any) -> int:
    _, _, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    return int(mig[0]["id"])


def nvmlDeviceGetComputeInstanceId(device: Any) -> int:
    _, _, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    return int(mig[1]["id"])


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


# -- topology ------------------------------------------------------------------------------


def _link(device: Any, link: int) -> str:
    _, entry, _ = _target(device)
    links = entry.get("nvlinks", [])
    if not links:
        raise NVMLError_NotSupported()
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError_InvalidArgument()
    if link >= len(links):
        raise NVMLError_NotSupported()
    return str(links[link])


def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
    _link(device, link)
    return int(NVML_FEATURE_ENABLED)


def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> Any:
    info = _real.nvmlPciInfo_t()
    info.busId = _link(device, link).encode()
    return info


def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
    description, _, _ = _target(device1)
    _target(device2)
    first, second = _key(device1)[1], _key(device2)[1]
    matrix = description.get("topology")
    if not matrix:
        return int(_real.NVML_TOPOLOGY_SYSTEM)
    return int(matrix[first][second])


# -- events ----------------------------------------------------------------------------------


def nvmlEventSetCreate() -> Any:
    description = _initialized()
    target = _real.struct_c_nvmlEventSet_t()
    with _lock:
        _event_sets[ctypes.addressof(target)] = {
            "target": target,
            "gpus": {},  # GPU index -> registered event types
            "next": len(description.get("events", [])),  # only events from now on
        }
    return ctypes.pointer(target)


def _event_set(events: Any) -> dict[str, Any]:
    address = _address(events)
    if address not in _event_sets:
        raise NVMLError_InvalidArgument()
    return _event_sets[address]


def _supported_events(entry: dict[str, Any]) -> int:
    events = entry.get("events", True)
    if events is True:
        return int(ALL_EVENTS)
    if not events:
        return 0
    return int(sum(EVENT_TYPES[name] for name in events))


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _, entry, _ = _target(handle)
    return _supported_events(entry)


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    """NotSupported when the GPU does not support some of the requested event types."""
    _, entry, _ = _target(handle)
    supported = _supported_events(entry)
    if not supported or int(eventTypes) & ~supported:
        raise NVMLError_NotSupported()
    with _lock:
        registered = _event_set(eventSet)["gpus"]
        index = _key(handle)[1]
        registered[index] = registered.get(index, 0) | int(eventTypes)


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> Any:
    """The next registered event; Timeout after `timeoutms`; GpuIsLost when a GPU of the
    set fell off the bus, or the driver's 'waitError'."""
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        description = _initialized()
        with _lock:
            state = _event_set(eventSet)
            wait_error = description.get("driver", {}).get("waitError")
            if wait_error:
                raise _error(wait_error)
            for index in state["gpus"]:
                if index >= len(description["gpus"]) or description["gpus"][index].get("lost"):
                    raise NVMLError_GpuIsLost()
            events = description.get("events", [])
            while state["next"] < len(events):
                event = events[state["next"]]
                state["next"] += 1
                kind = EVENT_TYPES[event.get("type", "xid")]
                if not state["gpus"].get(event["gpu"], 0) & kind:
                    continue
                data = _real.c_nvmlEventData_t()
                data.device = _handle(("gpu", event["gpu"]))
                data.eventType = kind
                data.eventData = int(event.get("xid") or 0)
                gi, ci = event.get("gi"), event.get("ci")
                data.gpuInstanceId = ALL_INSTANCES if gi is None else int(gi)
                data.computeInstanceId = ALL_INSTANCES if ci is None else int(ci)
                return data
        if time.monotonic() >= deadline:
            raise NVMLError_Timeout()
        time.sleep(POLL_S)


def nvmlEventSetFree(eventSet: Any) -> None:
    with _lock:
        if _event_sets.pop(_address(eventSet), None) is None:
            raise NVMLError_InvalidArgument()
