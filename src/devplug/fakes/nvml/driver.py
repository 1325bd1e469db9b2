"""The fake driver's state: the host description read from its file (again when it
changes) and written back, the handles given out, init and shutdown, and pynvml's own
errors, constants and types re-exported, so that callers' `except` clauses and
comparisons see the real ones."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import pynvml as _real

from devplug.fakes import gpus as _state
from devplug.fakes.gpumodels import MigRow
from devplug.fakes.gpus import DESCRIPTION_ENV
from devplug.ground.files import write_atomic

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
