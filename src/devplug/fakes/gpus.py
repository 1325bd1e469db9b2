"""Fake GPU hosts: the descriptions the fake NVML (`devplug.fakes.nvml`) reads, how
to build them (in Python or from YAML), and how they change while a daemon runs.

    host = FakeGpuHost(tmp, fake_host("gpus: [{model: H100-SXM5-80GB, count: 8, "
                                      "mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]}]"))
    host.inject_xid(3, 79)             # GPU 3 turns Unhealthy
    host.create_mig(0, "1g.10gb")      # as `nvidia-smi mig -cgi 1g.10gb -C` would

A description is JSON: {"driver": {"loaded", "library", "version", "cuda", "hang",
"initError", "waitError"}, "gpus": [{"uuid", "name", "memory", "cc", "busId",
"deviceId", "minor", "numa", "model", "migMode" (null: not MIG-capable, 0 off, 1 on),
"gpuInstances": [{"id", "profile", "start", "size", "computeInstances": [{"id",
"profile", "start", "size", "uuid"}]}], "migAccess", "migConfig", "lost", "error",
"events", "recoveryAction", "nvlinks": [remote bus IDs, one per link]}], "topology":
N x N common-ancestor levels, "events": [{"gpu", "type" (xid, dbe, sbe), "xid", "gi",
"ci"}], "machine": DMI product name}. MIG instances follow the model's profile table
(`devplug.fakes.gpumodels`) with NVML's rules: placements, instance limits and
overlaps, errors included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from copy import deepcopy
from pathlib import Path
from typing import Any

import pynvml as _real
import yaml

from devplug.fakes.devnodes import (
    CONTROL_MINOR,
    MIG_CI_IDS,
    MIG_GI_IDS,
    NVIDIA_MAJOR,
    device_node,
    driver_major,
    mig_minors,
)
from devplug.fakes.gpumodels import COMPUTE_PLACEMENTS, GpuModel, MigRow, model, row
from devplug.ground.files import write_atomic

DESCRIPTION_ENV = "DEVPLUG_FAKE_NVML"
MODULE = "devplug.fakes.nvml"


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-4222-8333-{0xFACE0000 + index:012x}"


def mig_uuid(gpu: int, gi: int, ci: int = 0) -> str:
    return f"MIG-{gpu:08x}-{gi:04x}-4{ci:03x}-8333-{0xC0DE0000 + gpu * 256 + gi * 8 + ci:012x}"


def bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


# -- GPUs ----------------------------------------------------------------------------------


def gpu(
    index: int,
    *,
    model_key: str | None = None,
    name: str = "NVIDIA H100 80GB HBM3",
    memory_gib: float | None = None,
    cc: tuple[int, int] | None = None,
    numa: int | None = None,
    mig: Iterable[str] | None = None,
) -> dict[str, Any]:
    """One GPU of a description. `model_key` takes name, memory, compute capability and
    the MIG table from a model of `gpumodels` (the default: the H100 80GB); `mig` turns
    MIG mode on and creates these instances in order, each '1g.10gb' or '1g.10gb@4' (at
    memory slice 4), '1c.3g.40gb' for a compute instance of part of a GPU instance, as
    `nvidia-smi mig -cgi ... -C` would. A GPU given a `name` and no model has no MIG."""
    spec = _model_for(model_key, name)
    entry: dict[str, Any] = {
        "uuid": gpu_uuid(index),
        "name": spec.name if spec is not None else name,
        "memory": spec.memory if spec is not None else round((memory_gib or 80) * 1024**3),
        "cc": list(spec.cc if spec is not None else cc or (9, 0)),
        "busId": bus_id(index),
        "deviceId": spec.device_id if spec is not None else 0x2330,
        "minor": index,
        "numa": numa,
        "migMode": 0 if spec is not None and spec.mig else None,
        "nvlinks": [],
    }
    if memory_gib is not None:
        entry["memory"] = round(memory_gib * 1024**3)
    if cc is not None:
        entry["cc"] = list(cc)
    if spec is not None:
        entry["model"] = spec.key
    if mig is not None:
        if spec is None or not spec.mig:
            raise ValueError(f"GPU {index} ({entry['name']}): no MIG profile table")
        entry["migMode"] = 1
        for item in mig:
            create_from_name(entry, item)
    return entry


def _model_for(key: str | None, name: str) -> GpuModel | None:
    if key is not None:
        return model(key)
    if name == "NVIDIA H100 80GB HBM3":
        return model("H100-SXM5-80GB")
    return None


def eight_gpus() -> dict[str, Any]:
    """8 H100s on 2 NUMA nodes (0-3, 4-7), two per PCIe switch ((0,1), (2,3)...), and
    NVLink pairs across the switches: (0,3), (1,2), (4,7), (5,6), four links each. A
    NUMA- or switch-local choice of two GPUs is not an NVLink pair; the best one is."""
    gpus = [gpu(i, numa=i // 4) for i in range(8)]
    for a, b in ((0, 3), (1, 2), (4, 7), (5, 6)):
        gpus[a]["nvlinks"] = [gpus[b]["busId"]] * 4
        gpus[b]["nvlinks"] = [gpus[a]["busId"]] * 4
    return {"driver": {"loaded": True}, "gpus": gpus, "topology": _switch_pairs(8), "events": []}


def _switch_pairs(count: int) -> list[list[int]]:
    """Common-ancestor levels: two GPUs per PCIe switch, half of them per NUMA node."""
    half = max(1, count // 2)
    return [
        [
            0 if i == j else 10 if i // 2 == j // 2 else 40 if i // half == j // half else 50
            for j in range(count)
        ]
        for i in range(count)
    ]


def mig_layout() -> dict[str, Any]:
    """Three A100 40GB: GPU 0 in 7 x 1g.5gb, GPU 1 in 3g.20gb + 2 x 2g.10gb, GPU 2
    MIG-capable with MIG off."""
    a100 = {"model_key": "A100-SXM4-40GB", "numa": 0}
    gpus = [
        gpu(0, mig=["1g.5gb"] * 7, **a100),  # type: ignore[arg-type]
        gpu(1, mig=["3g.20gb", "2g.10gb", "2g.10gb"], **a100),  # type: ignore[arg-type]
        gpu(2, **a100),  # type: ignore[arg-type]
    ]
    return {"driver": {"loaded": True}, "gpus": gpus, "topology": [], "events": []}


def fake_host(text: str) -> dict[str, Any]:
    """A description from YAML, for a test or a fleet:

    driver: {version: 550.54.15, cuda: 12040}   # optional
    gpus:
      - model: H100-SXM5-80GB
        count: 8                        # GPUs of this kind (1 by default)
        numa: [0, 0, 0, 0, 1, 1, 1, 1]  # or one number for all
        mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]   # MIG on, these instances
        fabric: {clusterUuid: <UUID>, cliqueId: 1}  # an NVLink fabric (GB200 NVL)
    nvlink: pairs      # none (default), pairs (0-1, 2-3...) or all (NVSwitch)
    """
    data = yaml.safe_load(text) or {}
    gpus: list[dict[str, Any]] = []
    for group in data.get("gpus", []):
        count = int(group.get("count", 1))
        numa = group.get("numa")
        for k in range(count):
            node = numa[k] if isinstance(numa, list) else numa
            gpus.append(gpu(len(gpus), model_key=group["model"], numa=node, mig=group.get("mig")))
            if "fabric" in group:  # NVLink fabric: {clusterUuid, cliqueId[, state, status]}
                gpus[-1]["fabric"] = dict(group["fabric"])
    nvlink = data.get("nvlink", "none")
    if nvlink == "pairs":
        for a in range(0, len(gpus) - 1, 2):
            gpus[a]["nvlinks"] = [gpus[a + 1]["busId"]] * 4
            gpus[a + 1]["nvlinks"] = [gpus[a]["busId"]] * 4
    elif nvlink == "all":
        for entry in gpus:  # links to NVSwitch ports, which are no GPU
            entry["nvlinks"] = ["00000000:F0:00.0"] * 18
    elif nvlink != "none":
        raise ValueError(f"nvlink: expected none, pairs or all, got {nvlink!r}")
    driver = {"loaded": True, **data.get("driver", {})}
    return {"driver": driver, "gpus": gpus, "topology": _switch_pairs(len(gpus)), "events": []}


# -- MIG state, as NVML changes it ---------------------------------------------------------


def mig_rows(entry: dict[str, Any]) -> tuple[MigRow, ...]:
    if entry.get("model") is None:
        return ()
    return model(entry["model"]).mig


def gpu_instances(entry: dict[str, Any]) -> list[dict[str, Any]]:
    instances: list[dict[str, Any]] = entry.setdefault("gpuInstances", [])
    return instances


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


def free_placements(entry: dict[str, Any], profile: MigRow) -> list[tuple[int, int]]:
    """The placements of `profile` a new GPU instance can take now."""
    existing = gpu_instances(entry)
    if sum(1 for gi in existing if gi["profile"] == profile.id) >= profile.instances:
        return []
    return [
        (start, size)
        for start, size in profile.placements
        if not any(_overlaps(start, size, gi["start"], gi["size"]) for gi in existing)
    ]


def _gi_id(entry: dict[str, Any], start: int, size: int) -> int:
    """The GPU instance ID the driver gives a placement, as the MIG user guide's examples
    show it: 0 for the whole GPU, 1-2 for half of it, 3-6 for a quarter, 7-13 for an
    eighth (7 + start); the next free ID otherwise."""
    used = {gi["id"] for gi in gpu_instances(entry)}
    wanted = {8: 0, 4: 1 if start == 0 else 2, 2: 3 + start // 2, 1: 7 + start}.get(size)
    if wanted is not None and wanted not in used:
        return wanted
    return min(i for i in range(MIG_GI_IDS) if i not in used)


def create_gpu_instance(
    entry: dict[str, Any], profile_id: int, start: int | None = None
) -> dict[str, Any]:
    """nvmlDeviceCreateGpuInstance(WithPlacement): NotSupported without MIG mode,
    InvalidArgument for an unknown profile or placement, InsufficientResources when it
    does not fit. Without a placement the driver picks one (here: the highest free)."""
    if entry.get("migMode") != 1:
        raise _real.NVMLError_NotSupported()
    profile = next((r for r in mig_rows(entry) if r.id == profile_id), None)
    if profile is None:
        raise _real.NVMLError_InvalidArgument()
    if start is not None and start not in {s for s, _ in profile.placements}:
        raise _real.NVMLError_InvalidArgument()
    free = free_placements(entry, profile)
    if start is not None:
        free = [p for p in free if p[0] == start]
    if not free:
        raise _real.NVMLError_InsufficientResources()
    start, size = max(free)
    instance = {
        "id": _gi_id(entry, start, size),
        "profile": profile.id,
        "start": start,
        "size": size,
        "computeInstances": [],
    }
    gpu_instances(entry).append(instance)
    return instance


def compute_profiles(instance: dict[str, Any], rows: Iterable[MigRow]) -> list[tuple[int, int]]:
    """(compute profile ID, slices) a GPU instance offers."""
    slices = next(r.slices for r in rows if r.id == instance["profile"])
    return [(p, s) for p, s, _ in COMPUTE_PLACEMENTS.get(slices, ())]


def create_compute_instance(
    entry: dict[str, Any],
    instance: dict[str, Any],
    profile_id: int,
    start: int | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """nvmlGpuInstanceCreateComputeInstance(WithPlacement): NotSupported for a profile the
    GPU instance does not offer, InvalidArgument for a bad placement,
    InsufficientResources when its compute slices are taken."""
    gi_row = next(r for r in mig_rows(entry) if r.id == instance["profile"])
    offered = {p: (s, starts) for p, s, starts in COMPUTE_PLACEMENTS.get(gi_row.slices, ())}
    if profile_id not in offered:
        raise _real.NVMLError_NotSupported()
    size, starts = offered[profile_id]
    if start is not None and start not in starts:
        raise _real.NVMLError_InvalidArgument()
    existing = instance.setdefault("computeInstances", [])
    candidates = [
        s
        for s in starts
        if (start is None or s == start)
        and not any(_overlaps(s, size, ci["start"], ci["size"]) for ci in existing)
    ]
    if not candidates:
        raise _real.NVMLError_InsufficientResources()
    used = {ci["id"] for ci in existing}
    ci_id = min(i for i in range(MIG_CI_IDS) if i not in used)
    compute = {
        "id": ci_id,
        "profile": profile_id,
        "start": candidates[0],
        "size": size,
        "uuid": mig_uuid(index, instance["id"], ci_id),
    }
    existing.append(compute)
    return compute


def create_from_name(entry: dict[str, Any], item: str) -> dict[str, Any]:
    """'1g.10gb', '1g.10gb@4' or '1c.3g.40gb': a GPU instance and one compute instance."""
    name, _, at = item.partition("@")
    compute_slices: int | None = None
    if name.count(".") == 2:  # '1c.3g.40gb'
        first, _, name = name.partition(".")
        compute_slices = int(first.removesuffix("c"))
    spec = model(entry["model"])
    gi_row = row(spec, name)
    instance = create_gpu_instance(entry, gi_row.id, int(at) if at else None)
    wanted = compute_slices or gi_row.slices
    offered = [p for p, s in compute_profiles(instance, spec.mig) if s == wanted]
    if not offered:
        raise ValueError(f"{item}: {name} has no compute instance of {wanted} slices")
    create_compute_instance(entry, instance, offered[0], index=int(entry.get("minor", 0)))
    return instance


def destroy_gpu_instance(entry: dict[str, Any], gi_id: int) -> None:
    """nvmlGpuInstanceDestroy: InUse while it has compute instances."""
    instance = find_gpu_instance(entry, gi_id)
    if instance.get("computeInstances"):
        raise _real.NVMLError_InUse()
    gpu_instances(entry).remove(instance)


def destroy_compute_instance(entry: dict[str, Any], gi_id: int, ci_id: int) -> None:
    """nvmlComputeInstanceDestroy: InUse while processes run on it ("busy")."""
    instance = find_gpu_instance(entry, gi_id)
    compute = find_compute_instance(instance, ci_id)
    if compute.get("busy"):
        raise _real.NVMLError_InUse()
    instance["computeInstances"].remove(compute)


def find_gpu_instance(entry: dict[str, Any], gi_id: int) -> dict[str, Any]:
    for instance in gpu_instances(entry):
        if instance["id"] == gi_id:
            return instance
    raise _real.NVMLError_NotFound()


def find_compute_instance(instance: dict[str, Any], ci_id: int) -> dict[str, Any]:
    for compute in instance.get("computeInstances", []):
        if compute["id"] == ci_id:
            found: dict[str, Any] = compute
            return found
    raise _real.NVMLError_NotFound()


def mig_devices(entry: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(GPU instance, compute instance) of each MIG device, in NVML's order (by GPU
    instance ID, then compute instance ID)."""
    if entry.get("migMode") != 1:
        return []
    found = [(gi, ci) for gi in gpu_instances(entry) for ci in gi.get("computeInstances", [])]
    return sorted(found, key=lambda pair: (pair[0]["id"], pair[1]["id"]))


# -- hosts for tests -----------------------------------------------------------------------


class FakeGpuHost:
    """A fake NVIDIA host in a folder: the NVML description, and under `host_root` the
    sysfs NUMA files, the MIG capability minors and the driver's device nodes."""

    def __init__(self, folder: Path | str, description: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "nvml.json"
        self.host_root = str(self.folder / "host")
        self.description = deepcopy(description)
        self.description.setdefault("events", self.description.pop("xids", []))
        self._write_host()
        self.write()

    @property
    def env(self) -> dict[str, str]:
        """What a daemon's environment needs to load this fake instead of pynvml."""
        return {"DEVPLUG_NVML_MODULE": MODULE, DESCRIPTION_ENV: str(self.path)}

    def write(self) -> None:
        write_atomic(self.path, json.dumps(self.description, indent=1))

    def reload(self) -> None:
        """Read the description back (after something changed it through the fake)."""
        self.description = json.loads(self.path.read_text())

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        change(self.description)
        self.write()

    def gpu(self, index: int) -> dict[str, Any]:
        entry: dict[str, Any] = self.description["gpus"][index]
        return entry

    def inject_xid(
        self, index: int, xid: int, gi: int | None = None, ci: int | None = None
    ) -> None:
        self.update(
            lambda d: d["events"].append(
                {"gpu": index, "type": "xid", "xid": xid, "gi": gi, "ci": ci}
            )
        )

    def inject_ecc(self, index: int, double_bit: bool = True) -> None:
        """A double-bit (or single-bit) ECC error event on GPU `index`."""
        kind = "dbe" if double_bit else "sbe"
        self.update(lambda d: d["events"].append({"gpu": index, "type": kind}))

    def set_lost(self, index: int, lost: bool) -> None:
        self.update(lambda d: d["gpus"][index].__setitem__("lost", lost))

    def set(self, index: int, **values: Any) -> None:
        """Set keys of GPU `index` ('error': 'NoPermission', 'migAccess': False...)."""
        self.update(lambda d: d["gpus"][index].update(values))

    def set_driver(self, **values: Any) -> None:
        """Set keys of the driver: loaded, library, hang, initError, waitError."""
        self.update(lambda d: d.setdefault("driver", {}).update(values))

    def create_mig(self, index: int, item: str) -> dict[str, Any]:
        """A MIG device on GPU `index` ('1g.10gb', '1g.10gb@6', '1c.3g.40gb'), as
        `nvidia-smi mig -cgi ... -C` makes it; raises NVML's error when it cannot."""
        instance = create_from_name(self.gpu(index), item)
        self.write()
        return instance

    def destroy_mig(self, index: int) -> None:
        """Every compute and GPU instance of GPU `index` (`-dci` then `-dgi`)."""
        entry = self.gpu(index)
        for instance in list(gpu_instances(entry)):
            for compute in list(instance.get("computeInstances", [])):
                destroy_compute_instance(entry, instance["id"], compute["id"])
            destroy_gpu_instance(entry, instance["id"])
        self.write()

    @property
    def dev_root(self) -> str:
        """The host's /dev of this fake: give it as the config's `devRoot` for a container
        runtime to find the nodes (they are real character devices)."""
        return str(Path(self.host_root) / "dev")

    def _write_host(self) -> None:
        root = Path(self.host_root)
        dev = Path(self.dev_root)
        (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        uvm = driver_major("nvidia-uvm")
        nodes = {"nvidiactl": (NVIDIA_MAJOR, CONTROL_MINOR, 0o666)}
        nodes.update({"nvidia-uvm": (uvm, 0, 0o666), "nvidia-uvm-tools": (uvm, 1, 0o666)})
        for entry in self.description["gpus"]:
            nodes[f"nvidia{entry['minor']}"] = (NVIDIA_MAJOR, entry["minor"], 0o666)
        lines = mig_minors(g for g in self.description["gpus"] if g.get("migMode") is not None)
        caps = driver_major("nvidia-caps")
        for line in lines:  # config (only root may read it), monitor, each instance's
            cap, _, number = line.rpartition(" ")
            mode = 0o400 if cap == "config" else 0o444
            nodes[f"nvidia-caps/nvidia-cap{number}"] = (caps, int(number), mode)
        for name, (major, minor, mode) in nodes.items():
            if not (dev / name).exists():
                device_node(dev / name, major, minor, mode)
        for entry in self.description["gpus"]:
            bus = entry["busId"].lower()[4:]
            folder = root / "sys/bus/pci/devices" / bus
            folder.mkdir(parents=True, exist_ok=True)
            numa = entry.get("numa")
            (folder / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
            (folder / "class").write_text(f"{entry.get('pciClass', '0x030200')}\n")
            (folder / "vendor").write_text("0x10de\n")
            if not (folder / "config").exists():  # a test may have written its own
                space = bytearray(256)  # as root reads it: the whole config space
                space[0:4] = (0x10DE | entry.get("deviceId", 0x2330) << 16).to_bytes(4, "little")
                (folder / "config").write_bytes(bytes(space))
        if machine := self.description.get("machine"):  # DMI, as GFD reads it
            dmi = root / "sys/class/dmi/id"
            dmi.mkdir(parents=True, exist_ok=True)
            (dmi / "product_name").write_text(f"{machine}\n")
        proc = root / "proc/driver/nvidia-caps"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "mig-minors").write_text("".join(line + "\n" for line in lines))
