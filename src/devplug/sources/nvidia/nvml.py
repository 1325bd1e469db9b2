"""NVML behind one small interface: what devplug asks the driver, as plain values.

Every NVML call of devplug is here. The binding is `pynvml` (nvidia-ml-py), imported
when an `Nvml` is made, never before; `DEVPLUG_NVML_MODULE` names another module with
pynvml's functions, errors and types (the tests' fake driver). All calls block: the
callers run them off the event loop, with timeouts (`devplug.sources.nvidia.blocking`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from devplug.sources.nvidia.mig import (
    Placement,
    profile_name,
)
from devplug.sources.nvidia.nvmlmig import NvmlMig, enum_for, text

NVML_MODULE_ENV = "DEVPLUG_NVML_MODULE"
ALL_INSTANCES = 0xFFFFFFFF  # an event's GPU/compute instance ID when it concerns them all
# A double-bit ECC event has no Xid; it is the event of Xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE).
DOUBLE_BIT_ECC = 48
RECOVERY_NONE = 0  # NVML_GPU_RECOVERY_ACTION_NONE


@dataclass(frozen=True, slots=True)
class MigInfo:
    """One MIG device (a compute instance of a GPU instance)."""

    uuid: str
    gpu_instance: int
    compute_instance: int
    slot: int  # its MIG device index on the GPU ('<GPU index>:<slot>' for deviceIDStrategy index)
    # NVIDIA's name: '1g.10gb', '1g.10gb+me', or '1c.2g.20gb' when it takes part of its
    # GPU instance (devplug.sources.nvidia.mig).
    profile: str
    memory: int  # bytes
    multiprocessors: int = 0
    gpu_slices: int = 0
    compute_slices: int = 0
    placement: Placement | None = None  # of its GPU instance (memory slices)
    # The engines it shares with the other compute instances of its GPU instance.
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory: int  # bytes
    compute_capability: tuple[int, int]
    bus_id: str  # sysfs form: '0000:1b:00.0'
    device_id: int  # PCI device ID (low 16 bits: the product)
    minor: int  # /dev/nvidia<minor>
    mig_capable: bool
    mig_enabled: bool
    migs: tuple[MigInfo, ...] = ()
    # Why the MIG devices of a MIG-enabled GPU cannot be listed (NoPermission in a
    # container without the MIG monitor capability); empty when they can.
    mig_problem: str = ""
    max_mig_devices: int = 0
    # The NVLink fabric it is attached to (cluster UUID, clique ID), or None.
    fabric: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class NvmlView:
    """What NVML says about the host at one moment."""

    driver_version: str
    cuda_version: str  # '12.4'
    gpus: tuple[GpuInfo, ...]
    # (i, j) with i < j, by GPU index: NVLinks between them, and the NVML topology
    # level of their closest common ancestor (10 one PCIe switch ... 50 across CPUs).
    nvlinks: dict[tuple[int, int], int] = field(default_factory=dict)
    ancestors: dict[tuple[int, int], int] = field(default_factory=dict)
    # GPUs NVML counts but cannot describe now (index, why): lost, or not ready.
    missing: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical Xid, or a double-bit ECC error (`xid` is then DOUBLE_BIT_ECC)."""

    index: int  # the GPU's index
    xid: int
    gpu_instance: int = ALL_INSTANCES
    compute_instance: int = ALL_INSTANCES


def bus_id(raw: str | bytes) -> str:
    """NVML's '00000000:1B:00.0' -> sysfs's '0000:1b:00.0'."""
    plain = raw.decode() if isinstance(raw, bytes) else raw
    domain, _, rest = plain.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class Nvml(NvmlMig):
    """NVML from `start` to `stop`; `Error`, `Lost` and `Timeout` classify what its calls raise."""

    def __init__(self) -> None:
        self.lib: Any = importlib.import_module(os.environ.get(NVML_MODULE_ENV) or "pynvml")
        self.Error: type[Exception] = self.lib.NVMLError
        self.Lost: type[Exception] = self.lib.NVMLError_GpuIsLost
        self.Timeout: type[Exception] = self.lib.NVMLError_Timeout
        self._handles: list[Any] = []

    # -- start, stop ---------------------------------------------------------------------

    def start(self) -> None:
        self.lib.nvmlInit()

    def stop(self) -> None:
        with contextlib.suppress(self.Error):
            self.lib.nvmlShutdown()

    # -- discovery -------------------------------------------------------------------

    def read(self) -> NvmlView:
        lib = self.lib
        driver = text(lib.nvmlSystemGetDriverVersion())
        cuda = int(lib.nvmlSystemGetCudaDriverVersion())
        count = int(lib.nvmlDeviceGetCount())
        self._handles = []
        found: list[GpuInfo] = []
        missing: list[tuple[int, str]] = []
        for index in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                found.append(self._gpu(index, handle))
            except self.Error as error:  # one GPU off the bus does not hide the others
                handle = None
                missing.append((index, f"{type(error).__name__}: {error}"))
            self._handles.append(handle)
        gpus = tuple(found)
        nvlinks, ancestors = self._topology(gpus)
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return NvmlView(driver, cuda_version, gpus, nvlinks, ancestors, tuple(missing))

    def _gpu(self, index: int, handle: Any) -> GpuInfo:
        lib = self.lib
        pci = lib.nvmlDeviceGetPciInfo(handle)
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
            capable, enabled = True, current == lib.NVML_DEVICE_MIG_ENABLE
        except lib.NVMLError_NotSupported:
            capable, enabled = False, False
        memory = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        migs: tuple[MigInfo, ...] = ()
        problem = ""
        max_migs = 0
        if enabled:
            max_migs = int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))
            try:
                migs = self._migs(handle, memory, max_migs)
            except lib.NVMLError_NoPermission as error:
                # A container without the driver's MIG monitor capability: the GPU is
                # there, its MIG devices cannot be listed. Said once, not retried as lost.
                problem = (
                    f"{type(error).__name__}: {error}: its MIG devices cannot be listed "
                    "(in a container, set NVIDIA_MIG_MONITOR_DEVICES=all and add the "
                    "SYS_ADMIN capability, as deploy/overlays/gpu does)"
                )
        return GpuInfo(
            index=index,
            uuid=text(lib.nvmlDeviceGetUUID(handle)),
            model=text(lib.nvmlDeviceGetName(handle)),
            memory=memory,
            compute_capability=tuple(lib.nvmlDeviceGetCudaComputeCapability(handle)),
            bus_id=bus_id(pci.busId),
            device_id=int(pci.pciDeviceId) >> 16,
            minor=int(lib.nvmlDeviceGetMinorNumber(handle)),
            mig_capable=capable,
            mig_enabled=enabled,
            migs=migs,
            mig_problem=problem,
            max_mig_devices=max_migs,
            fabric=self._fabric(handle),
        )

    def _fabric(self, handle: Any) -> tuple[str, str] | None:
        """(cluster UUID, clique ID) of a GPU whose fabric registration completed, as
        GFD reads it for gpu.clique; None where NVML has none (before Hopper)."""
        lib = self.lib
        info = lib.c_nvmlGpuFabricInfo_t()
        try:
            lib.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except (lib.NVMLError_NotSupported, lib.NVMLError_FunctionNotFound):
            return None
        if info.state != lib.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != 0:
            return None
        return str(uuid.UUID(bytes=bytes(info.clusterUuid))), str(info.cliqueId)

    def _migs(self, handle: Any, total: int, slots: int) -> tuple[MigInfo, ...]:
        """The MIG devices of a GPU, each named by NVIDIA's rule from its GPU instance's
        profile (found by the profile ID of its GPU instance, as go-nvlib does)."""
        lib = self.lib
        profiles = self._gpu_profile_ids(handle)
        migs = []
        for slot in range(slots):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError_NotFound:  # an empty slot
                continue
            attrs = lib.nvmlDeviceGetAttributes(mig)
            gi = int(lib.nvmlDeviceGetGpuInstanceId(mig))
            g, c = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
            placement: Placement | None = None
            enum: int | None = None
            try:
                info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(handle, gi))
                enum = profiles.get(int(info.profileId))
                placement = Placement(int(info.placement.start), int(info.placement.size))
            except (lib.NVMLError_NotSupported, lib.NVMLError_NotFound):
                pass  # older drivers: named from the slices alone
            name = profile_name(enum_for(enum, g), c, int(attrs.memorySizeMB), total)
            migs.append(
                MigInfo(
                    uuid=text(lib.nvmlDeviceGetUUID(mig)),
                    gpu_instance=gi,
                    compute_instance=int(lib.nvmlDeviceGetComputeInstanceId(mig)),
                    slot=slot,
                    profile=name,
                    memory=int(attrs.memorySizeMB) * 1024 * 1024,
                    multiprocessors=int(attrs.multiprocessorCount),
                    gpu_slices=g,
                    compute_slices=c,
                    placement=placement,
                    copy_engines=int(attrs.sharedCopyEngineCount),
                    decoders=int(attrs.sharedDecoderCount),
                    encoders=int(attrs.sharedEncoderCount),
                    jpegs=int(attrs.sharedJpegCount),
                    ofas=int(attrs.sharedOfaCount),
                )
            )
        return tuple(migs)

    def _topology(
        self, gpus: tuple[GpuInfo, ...]
    ) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
        lib = self.lib
        by_bus = {g.bus_id: g.index for g in gpus}
        links: dict[tuple[int, int], int] = {}
        switch_links: dict[int, int] = {}  # GPU -> links to NVSwitches
        for gpu in gpus:
            handle = self._handles[gpu.index]
            for link in range(int(lib.NVML_NVLINK_MAX_LINKS)):
                try:
                    if lib.nvmlDeviceGetNvLinkState(handle, link) != lib.NVML_FEATURE_ENABLED:
                        continue
                    remote = bus_id(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                except self.Error:  # no such link, or no NVLink at all
                    continue
                peer = by_bus.get(remote)
                if peer is None:
                    switch_links[gpu.index] = switch_links.get(gpu.index, 0) + 1
                elif peer > gpu.index:
                    links[(gpu.index, peer)] = links.get((gpu.index, peer), 0) + 1
        indices = [g.index for g in gpus]
        for i, j in _pairs(indices):
            through_switch = min(switch_links.get(i, 0), switch_links.get(j, 0))
            if through_switch:
                links[(i, j)] = links.get((i, j), 0) + through_switch
        ancestors: dict[tuple[int, int], int] = {}
        for i, j in _pairs(indices):
            try:
                ancestors[(i, j)] = int(
                    lib.nvmlDeviceGetTopologyCommonAncestor(self._handles[i], self._handles[j])
                )
            except self.Error:
                continue
        return links, ancestors

    def compute_mode(self, index: int) -> int:
        """The GPU's NVML_COMPUTEMODE_*."""
        return int(self.lib.nvmlDeviceGetComputeMode(self._handles[index]))

    def set_compute_mode(self, index: int, mode: int | None) -> None:
        """Set an NVML_COMPUTEMODE_* (None: EXCLUSIVE_PROCESS, for an MPS daemon);
        NVML's errors raised (NoPermission without root)."""
        lib = self.lib
        wanted = lib.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if mode is None else mode
        lib.nvmlDeviceSetComputeMode(self._handles[index], wanted)

    # -- health ----------------------------------------------------------------------

    def probe(self, index: int) -> int:
        """Ask the GPU something that reaches it; raises (GpuIsLost...) if it cannot
        answer. Returns the recovery action the driver asks for (NONE: none, or the
        driver cannot say)."""
        lib = self.lib
        handle = self._handles[index]
        lib.nvmlDeviceGetMemoryInfo(handle)
        try:
            [value] = lib.nvmlDeviceGetFieldValues(
                handle, [lib.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
            )
        except (lib.NVMLError_NotSupported, lib.NVMLError_FunctionNotFound, AttributeError):
            return RECOVERY_NONE  # older drivers and bindings
        if int(value.nvmlReturn) != int(lib.NVML_SUCCESS):
            return RECOVERY_NONE
        return int(value.value.uiVal)

    def watch_events(self, skip: Iterable[int] = ()) -> tuple[Any, list[int]]:
        """An event set for critical Xids and double-bit ECC errors (each where the GPU
        supports it, as NVIDIA's plugin registers them), and the GPUs that could not join
        it; GPUs in `skip` are left out."""
        lib = self.lib
        left_out = set(skip)
        present = [i for i, h in enumerate(self._handles) if h is not None and i not in left_out]
        try:
            events = lib.nvmlEventSetCreate()
        except self.Error:
            return None, present
        wanted = int(lib.nvmlEventTypeXidCriticalError) | int(lib.nvmlEventTypeDoubleBitEccError)
        unwatched = []
        for index in present:
            handle = self._handles[index]
            try:
                mask = wanted & int(lib.nvmlDeviceGetSupportedEventTypes(handle))
                if not mask & int(lib.nvmlEventTypeXidCriticalError):
                    raise lib.NVMLError_NotSupported()
                lib.nvmlDeviceRegisterEvents(handle, mask, events)
            except self.Error:
                unwatched.append(index)
        return events, unwatched

    def wait_event(self, events: Any, timeout_ms: int) -> XidEvent | None:
        """The next critical Xid or double-bit ECC error of the set, or None after
        `timeout_ms`; other errors (GpuIsLost...) are raised."""
        lib = self.lib
        try:
            data = lib.nvmlEventSetWait_v2(events, timeout_ms)
        except self.Timeout:
            return None
        kind = int(data.eventType)
        if kind & int(lib.nvmlEventTypeXidCriticalError):
            xid = int(data.eventData)
        elif kind & int(lib.nvmlEventTypeDoubleBitEccError):
            xid = DOUBLE_BIT_ECC
        else:
            return None
        address = _address(data.device)
        index = next(
            (i for i, h in enumerate(self._handles) if h is not None and _address(h) == address),
            -1,
        )
        return XidEvent(index, xid, int(data.gpuInstanceId), int(data.computeInstanceId))

    def free(self, events: Any) -> None:
        with contextlib.suppress(self.Error):
            self.lib.nvmlEventSetFree(events)


def _pairs(indices: list[int]) -> list[tuple[int, int]]:
    return [(i, j) for n, i in enumerate(indices) for j in indices[n + 1 :]]
