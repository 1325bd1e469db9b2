"""GPUs and MIG devices through the fake NVML: counts, handles, names, memory, PCI,
compute mode, field values, and the MIG devices of a GPU in MIG mode."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _real

from devplug.fakes import gpus as _state
from devplug.fakes.gpumodels import MigRow, model
from devplug.fakes.nvml.driver import (
    NVML_COMPUTEMODE_DEFAULT,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_SUCCESS,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    NVMLError_InvalidArgument,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    _entry,
    _error,
    _handle,
    _initialized,
    _key,
    _lock,
    _mig_access,
    _row,
    _save,
    _target,
)


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
