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
import math
import os
from dataclasses import dataclass, field
from typing import Any

NVML_MODULE_ENV = "DEVPLUG_NVML_MODULE"
ALL_INSTANCES = 0xFFFFFFFF  # an event's GPU/compute instance ID when it concerns them all


@dataclass(frozen=True, slots=True)
class MigInfo:
    """One MIG device (a compute instance of a GPU instance)."""

    uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str  # '1g.10gb', or '1c.2g.20gb' when it takes part of its GPU instance
    memory: int  # bytes


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
    index: int  # the GPU's index
    xid: int
    gpu_instance: int = ALL_INSTANCES
    compute_instance: int = ALL_INSTANCES


def bus_id(raw: str | bytes) -> str:
    """NVML's '00000000:1B:00.0' -> sysfs's '0000:1b:00.0'."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    domain, _, rest = text.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class Nvml:
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
        driver = _text(lib.nvmlSystemGetDriverVersion())
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
        return GpuInfo(
            index=index,
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            model=_text(lib.nvmlDeviceGetName(handle)),
            memory=int(lib.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=tuple(lib.nvmlDeviceGetCudaComputeCapability(handle)),
            bus_id=bus_id(pci.busId),
            device_id=int(pci.pciDeviceId) >> 16,
            minor=int(lib.nvmlDeviceGetMinorNumber(handle)),
            mig_capable=capable,
            mig_enabled=enabled,
            migs=self._migs(handle) if enabled else (),
        )

    def _migs(self, handle: Any) -> tuple[MigInfo, ...]:
        lib = self.lib
        migs = []
        for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError_NotFound:  # an empty slot
                continue
            attrs = lib.nvmlDeviceGetAttributes(mig)
            gigabytes = math.ceil(int(attrs.memorySizeMB) / 1024)
            g, c = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
            profile = f"{g}g.{gigabytes}gb" if c == g else f"{c}c.{g}g.{gigabytes}gb"
            migs.append(
                MigInfo(
                    uuid=_text(lib.nvmlDeviceGetUUID(mig)),
                    gpu_instance=int(lib.nvmlDeviceGetGpuInstanceId(mig)),
                    compute_instance=int(lib.nvmlDeviceGetComputeInstanceId(mig)),
                    profile=profile,
                    memory=int(attrs.memorySizeMB) * 1024 * 1024,
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

    # -- health ----------------------------------------------------------------------

    def probe(self, index: int) -> None:
        """Ask the GPU something that reaches it; raises (GpuIsLost...) if it cannot answer."""
        self.lib.nvmlDeviceGetMemoryInfo(self._handles[index])

    def watch_xids(self) -> tuple[Any, list[int]]:
        """An event set for critical Xid errors, and the GPUs that could not join it."""
        lib = self.lib
        present = [i for i, h in enumerate(self._handles) if h is not None]
        try:
            events = lib.nvmlEventSetCreate()
        except self.Error:
            return None, present
        unwatched = []
        for index in present:
            handle = self._handles[index]
            try:
                supported = int(lib.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & lib.nvmlEventTypeXidCriticalError:
                    raise lib.NVMLError_NotSupported()
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, events)
            except self.Error:
                unwatched.append(index)
        return events, unwatched

    def wait_xid(self, events: Any, timeout_ms: int) -> XidEvent | None:
        """The next critical Xid of the set, or None after `timeout_ms`."""
        try:
            data = self.lib.nvmlEventSetWait_v2(events, timeout_ms)
        except self.Timeout:
            return None
        if not int(data.eventType) & self.lib.nvmlEventTypeXidCriticalError:
            return None
        address = _address(data.device)
        index = next(
            (i for i, h in enumerate(self._handles) if h is not None and _address(h) == address),
            -1,
        )
        return XidEvent(
            index, int(data.eventData), int(data.gpuInstanceId), int(data.computeInstanceId)
        )

    def free(self, events: Any) -> None:
        with contextlib.suppress(self.Error):
            self.lib.nvmlEventSetFree(events)


def _pairs(indices: list[int]) -> list[tuple[int, int]]:
    return [(i, j) for n, i in enumerate(indices) for j in indices[n + 1 :]]
