"""A fake NVML driver for tests and benchmarks on machines without an NVIDIA GPU.

It is a drop-in for the `pynvml` functions devplug uses, with their signatures, return
types (pynvml's ctypes structures and handles) and pynvml's own error classes, so the
code under test cannot tell it from a driver. A daemon loads it in place of pynvml
when `DEVPLUG_NVML_MODULE=devplug.testing.fakenvml`; it reads the host it pretends to
be from the JSON file named by `DEVPLUG_FAKE_NVML`, again whenever the file changes, so
a test can inject Xid events, lose a GPU and bring it back while the daemon runs.

    host = FakeGpuHost(tmp, eight_gpus())   # writes the JSON, sysfs NUMA files, /dev
    kubelet.start_serve(config, env=host.env)
    host.inject_xid(3, 79)                  # GPU 3 turns Unhealthy
    host.set_lost(5, True)                  # GPU 5 falls off the bus

Description: {"driver": {"loaded", "version", "cuda", "hang"}, "gpus": [{"uuid",
"name", "memory", "cc": [major, minor], "busId", "deviceId", "minor", "lost",
"events", "migMode" (null: not MIG-capable, 0 or 1), "migs": [{"uuid", "gi", "ci",
"giSlices", "ciSlices", "memoryMB"}], "nvlinks": [remote bus IDs, one per link]}],
"topology": N x N common-ancestor levels, "xids": [{"gpu", "xid", "gi", "ci"}]}.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import Any

import pynvml as _real

from devplug.outputs.files import write_atomic

DESCRIPTION_ENV = "DEVPLUG_FAKE_NVML"
MODULE = "devplug.testing.fakenvml"
POLL_S = 0.005  # how often a blocked call looks at the description again

# pynvml's errors, constants and types, re-exported: the caller's `except` clauses
# and comparisons see the real ones.
NVMLError = _real.NVMLError
NVMLError_Uninitialized = _real.NVMLError_Uninitialized
NVMLError_NotSupported = _real.NVMLError_NotSupported
NVMLError_NotFound = _real.NVMLError_NotFound
NVMLError_InvalidArgument = _real.NVMLError_InvalidArgument
NVMLError_DriverNotLoaded = _real.NVMLError_DriverNotLoaded
NVMLError_Timeout = _real.NVMLError_Timeout
NVMLError_GpuIsLost = _real.NVMLError_GpuIsLost
NVML_DEVICE_MIG_ENABLE = _real.NVML_DEVICE_MIG_ENABLE
NVML_DEVICE_MIG_DISABLE = _real.NVML_DEVICE_MIG_DISABLE
NVML_NVLINK_MAX_LINKS = _real.NVML_NVLINK_MAX_LINKS
NVML_FEATURE_ENABLED = _real.NVML_FEATURE_ENABLED
nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError
c_nvmlDevice_t = _real.c_nvmlDevice_t
c_nvmlEventSet_t = _real.c_nvmlEventSet_t

_lock = threading.RLock()
_description: dict[str, Any] = {}
_seen: tuple[int, int, int] | None = None
_init_count = 0
_structs: dict[tuple[int, int], Any] = {}  # (gpu, mig slot or -1) -> the handle's target
_handles: dict[int, tuple[int, int]] = {}  # handle address -> (gpu, mig slot or -1)
_event_sets: dict[int, dict[str, Any]] = {}  # event set address -> its state


# -- the description ---------------------------------------------------------------------


def _load() -> dict[str, Any]:
    """The description, read again when its file changed."""
    global _description, _seen
    path = os.environ.get(DESCRIPTION_ENV)
    if not path:
        raise NVMLError_DriverNotLoaded()
    with _lock:
        try:
            info = os.stat(path)
        except OSError:
            raise NVMLError_DriverNotLoaded() from None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key != _seen:
            _description = json.loads(Path(path).read_text())
            _seen = key
        return _description


def _driver() -> dict[str, Any]:
    """The description once the driver answers: blocks while it 'hangs'."""
    while True:
        description = _load()
        driver = description.get("driver", {})
        if not driver.get("hang", False):
            return description
        time.sleep(POLL_S)


def _initialized() -> dict[str, Any]:
    description = _driver()
    if _init_count <= 0:
        raise NVMLError_Uninitialized()
    return description


def _target(handle: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(description, gpu, mig or None) of a handle; GpuIsLost when the GPU is lost."""
    description = _initialized()
    address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    if address not in _handles:
        raise _real.NVMLError_InvalidArgument()
    index, slot = _handles[address]
    gpus = description["gpus"]
    if index >= len(gpus):
        raise NVMLError_GpuIsLost()
    gpu = gpus[index]
    if gpu.get("lost", False):
        raise NVMLError_GpuIsLost()
    mig = gpu.get("migs", [])[slot] if slot >= 0 else None
    return description, gpu, mig


def _handle(index: int, slot: int = -1) -> Any:
    with _lock:
        target = _structs.get((index, slot))
        if target is None:
            target = _structs[(index, slot)] = _real.struct_c_nvmlDevice_t()
            _handles[ctypes.addressof(target)] = (index, slot)
    return ctypes.pointer(target)


# -- system --------------------------------------------------------------------------------


def nvmlInit() -> None:
    global _init_count
    description = _driver()
    if not description.get("driver", {}).get("loaded", True):
        raise NVMLError_DriverNotLoaded()
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
    gpus = _initialized()["gpus"]
    if not 0 <= index < len(gpus):
        raise NVMLError_InvalidArgument()
    if gpus[index].get("lost", False):
        raise NVMLError_GpuIsLost()
    return _handle(index)


# -- devices -------------------------------------------------------------------------------


def nvmlDeviceGetUUID(handle: Any) -> str:
    _, gpu, mig = _target(handle)
    return str((mig or gpu)["uuid"])


def nvmlDeviceGetName(handle: Any) -> str:
    _, gpu, mig = _target(handle)
    name = str(gpu["name"])
    if mig is not None:
        name += f" MIG {mig['giSlices']}g.{-(-mig['memoryMB'] // 1024)}gb"
    return name


def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> Any:
    _, gpu, mig = _target(handle)
    total = mig["memoryMB"] * 1024 * 1024 if mig is not None else int(gpu["memory"])
    return _real.c_nvmlMemory_t(total=total, free=total, used=0)


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    _, gpu, _ = _target(handle)
    major, minor = gpu.get("cc", [9, 0])
    return (int(major), int(minor))


def nvmlDeviceGetPciInfo(handle: Any) -> Any:
    _, gpu, _ = _target(handle)
    bus = str(gpu["busId"]).encode()
    info = _real.nvmlPciInfo_t()
    info.busId = bus
    info.busIdLegacy = bus[:16]
    domain, bus_number, rest = str(gpu["busId"]).split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus_number, 16), int(rest[:2], 16)
    info.pciDeviceId = (int(gpu.get("deviceId", 0x2330)) << 16) | 0x10DE
    return info


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    _, gpu, _ = _target(handle)
    return int(gpu["minor"])


def nvmlDeviceGetMigMode(device: Any) -> list[int]:
    _, gpu, mig = _target(device)
    if mig is not None or gpu.get("migMode") is None:
        raise NVMLError_NotSupported()
    return [int(gpu["migMode"]), int(gpu["migMode"])]


def nvmlDeviceGetMaxMigDeviceCount(device: Any) -> int:
    _, gpu, _ = _target(device)
    if gpu.get("migMode") is None:
        raise NVMLError_NotSupported()
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> Any:
    _, gpu, _ = _target(device)
    if gpu.get("migMode") != NVML_DEVICE_MIG_ENABLE:
        raise _real.NVMLError_InvalidArgument()
    if index >= len(gpu.get("migs", [])):
        raise NVMLError_NotFound()
    address = ctypes.cast(device, ctypes.c_void_p).value or 0
    return _handle(_handles[address][0], index)


def nvmlDeviceGetAttributes(device: Any) -> Any:
    _, _, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    attributes = _real.c_nvmlDeviceAttributes()
    attributes.gpuInstanceSliceCount = mig["giSlices"]
    attributes.computeInstanceSliceCount = mig.get("ciSlices", mig["giSlices"])
    attributes.memorySizeMB = mig["memoryMB"]
    attributes.multiprocessorCount = 14 * mig["giSlices"]
    return attributes


def nvmlDeviceGetGpuInstanceId(device: Any) -> int:
    _, _, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    return int(mig["gi"])


def nvmlDeviceGetComputeInstanceId(device: Any) -> int:
    _, _, mig = _target(device)
    if mig is None:
        raise NVMLError_NotSupported()
    return int(mig.get("ci", 0))


# -- topology ------------------------------------------------------------------------------


def _link(device: Any, link: int) -> str:
    _, gpu, _ = _target(device)
    links = gpu.get("nvlinks", [])
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
    first = _handles[ctypes.cast(device1, ctypes.c_void_p).value or 0][0]
    second = _handles[ctypes.cast(device2, ctypes.c_void_p).value or 0][0]
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
            "gpus": set(),
            "next": len(description.get("xids", [])),  # only events from now on
        }
    return ctypes.pointer(target)


def _event_set(events: Any) -> dict[str, Any]:
    address = ctypes.cast(events, ctypes.c_void_p).value or 0
    if address not in _event_sets:
        raise NVMLError_InvalidArgument()
    return _event_sets[address]


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _, gpu, _ = _target(handle)
    if not gpu.get("events", True):
        return 0
    return int(nvmlEventTypeXidCriticalError | _real.nvmlEventTypeSingleBitEccError)


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    _, gpu, _ = _target(handle)
    if not gpu.get("events", True):
        raise NVMLError_NotSupported()
    address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    with _lock:
        _event_set(eventSet)["gpus"].add(_handles[address][0])


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> Any:
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        description = _initialized()
        with _lock:
            state = _event_set(eventSet)
            xids = description.get("xids", [])
            while state["next"] < len(xids):
                event = xids[state["next"]]
                state["next"] += 1
                if event["gpu"] in state["gpus"]:
                    data = _real.c_nvmlEventData_t()
                    data.device = _handle(event["gpu"])
                    data.eventType = nvmlEventTypeXidCriticalError
                    data.eventData = int(event["xid"])
                    gi, ci = event.get("gi"), event.get("ci")
                    data.gpuInstanceId = 0xFFFFFFFF if gi is None else int(gi)
                    data.computeInstanceId = 0xFFFFFFFF if ci is None else int(ci)
                    return data
        if time.monotonic() >= deadline:
            raise NVMLError_Timeout()
        time.sleep(POLL_S)


def nvmlEventSetFree(eventSet: Any) -> None:
    address = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
    with _lock:
        if _event_sets.pop(address, None) is None:
            raise NVMLError_InvalidArgument()


# -- hosts for tests ---------------------------------------------------------------------------


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-4222-8333-{0xFACE0000 + index:012x}"


def mig_uuid(gpu: int, slot: int) -> str:
    return f"MIG-{gpu:08x}-{slot:04x}-4222-8333-{0xC0DE0000 + gpu * 16 + slot:012x}"


def gpu(
    index: int,
    *,
    name: str = "NVIDIA H100 80GB HBM3",
    memory_gib: int = 80,
    cc: tuple[int, int] = (9, 0),
    numa: int | None = None,
    mig: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """One GPU of a description; `mig` lists (gpu-instance slices, memory MB) per MIG
    device and turns MIG mode on (its "numa" is written to sysfs by FakeGpuHost)."""
    entry: dict[str, Any] = {
        "uuid": gpu_uuid(index),
        "name": name,
        "memory": memory_gib * 1024**3,
        "cc": list(cc),
        "busId": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "deviceId": 0x2330,
        "minor": index,
        "numa": numa,
        "migMode": None,
        "nvlinks": [],
    }
    if mig is not None:
        entry["migMode"] = 1
        entry["migs"] = [
            {"uuid": mig_uuid(index, slot), "gi": slot + 1, "ci": 0, "giSlices": g, "memoryMB": mb}
            for slot, (g, mb) in enumerate(mig)
        ]
    return entry


def eight_gpus() -> dict[str, Any]:
    """8 H100s on 2 NUMA nodes (0-3, 4-7), two per PCIe switch ((0,1), (2,3)...), and
    NVLink pairs across the switches: (0,3), (1,2), (4,7), (5,6), four links each. A
    NUMA- or switch-local choice of two GPUs is not an NVLink pair; the best one is."""
    gpus = [gpu(i, numa=i // 4) for i in range(8)]
    for a, b in ((0, 3), (1, 2), (4, 7), (5, 6)):
        gpus[a]["nvlinks"] = [gpus[b]["busId"]] * 4
        gpus[b]["nvlinks"] = [gpus[a]["busId"]] * 4
    topology = [
        [
            0 if i == j else 10 if i // 2 == j // 2 else 40 if i // 4 == j // 4 else 50
            for j in range(8)
        ]
        for i in range(8)
    ]
    return {"driver": {"loaded": True}, "gpus": gpus, "topology": topology, "xids": []}


def mig_layout() -> dict[str, Any]:
    """Three A100 40GB: GPU 0 in 7 x 1g.5gb, GPU 1 in 3g.20gb + 2 x 2g.10gb, GPU 2 whole."""
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_gib": 40, "cc": (8, 0), "numa": 0}
    gpus = [
        gpu(0, mig=[(1, 4864)] * 7, **a100),  # type: ignore[arg-type]
        gpu(1, mig=[(3, 19968), (2, 9728), (2, 9728)], **a100),  # type: ignore[arg-type]
        gpu(2, **a100),  # type: ignore[arg-type]
    ]
    gpus[2]["migMode"] = 0  # MIG-capable, MIG off
    return {"driver": {"loaded": True}, "gpus": gpus, "topology": [], "xids": []}


class FakeGpuHost:
    """A fake NVIDIA host in a folder: the NVML description, and under `host_root` the
    sysfs NUMA files, the MIG capability minors and the driver's device nodes."""

    def __init__(self, folder: Path | str, description: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "nvml.json"
        self.host_root = str(self.folder / "host")
        self.description = deepcopy(description)
        self._write_host()
        self.write()

    @property
    def env(self) -> dict[str, str]:
        """What a daemon's environment needs to load this fake instead of pynvml."""
        return {"DEVPLUG_NVML_MODULE": MODULE, DESCRIPTION_ENV: str(self.path)}

    def write(self) -> None:
        write_atomic(self.path, json.dumps(self.description, indent=1))

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        change(self.description)
        self.write()

    def inject_xid(
        self, index: int, xid: int, gi: int | None = None, ci: int | None = None
    ) -> None:
        self.update(
            lambda d: d.setdefault("xids", []).append(
                {"gpu": index, "xid": xid, "gi": gi, "ci": ci}
            )
        )

    def set_lost(self, index: int, lost: bool) -> None:
        self.update(lambda d: d["gpus"][index].__setitem__("lost", lost))

    def set_driver(self, *, loaded: bool | None = None, hang: bool | None = None) -> None:
        def change(d: dict[str, Any]) -> None:
            driver = d.setdefault("driver", {})
            if loaded is not None:
                driver["loaded"] = loaded
            if hang is not None:
                driver["hang"] = hang

        self.update(change)

    def _write_host(self) -> None:
        root = Path(self.host_root)
        dev = root / "dev"
        (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        names = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
        names += [f"nvidia{g['minor']}" for g in self.description["gpus"]]
        for name in names:
            if not (dev / name).exists():
                os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        minors: list[str] = []
        cap = 1
        for entry in self.description["gpus"]:
            bus = entry["busId"].lower()[4:]
            folder = root / "sys/bus/pci/devices" / bus
            folder.mkdir(parents=True, exist_ok=True)
            numa = entry.get("numa")
            (folder / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
            for mig in entry.get("migs", []):
                gi = f"gpu{entry['minor']}/gi{mig['gi']}"
                minors += [f"{gi}/access {cap}", f"{gi}/ci{mig.get('ci', 0)}/access {cap + 1}"]
                cap += 2
        proc = root / "proc/driver/nvidia-caps"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "mig-minors").write_text("".join(line + "\n" for line in minors))
