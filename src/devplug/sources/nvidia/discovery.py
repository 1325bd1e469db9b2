"""From what NVML sees to what is served: units (GPUs or MIG devices), their resource
names, host files (NUMA node, MIG capability nodes) and the Devices with their edits.

Two roots: `hostRoot` is where the daemon reads the host's /dev, /proc and /sys (a
container mounts them elsewhere); the config's `devRoot` is where the runtime finds the
driver's nodes on the host, the host path of each node (`<devRoot>/nvidia0`), as it is
for sysfs devices. The container path stays `/dev/...`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from devplug.framework.device import Attribute, Device, DeviceNode, Mount
from devplug.sources.config import replica_ids
from devplug.sources.hardware import DEFAULT_DEV_ROOT
from devplug.sources.nvidia.config import NvidiaSpec
from devplug.sources.nvidia.mig import resource_suffix
from devplug.sources.nvidia.nvml import GpuInfo, MigInfo, NvmlView

VENDOR_ID = "0x10de"
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Unit:
    """One schedulable GPU or MIG device, before replication."""

    uuid: str
    gpu: GpuInfo
    mig: MigInfo | None
    resource: str
    numa: int | None
    nodes: tuple[DeviceNode, ...]
    attributes: dict[str, Attribute] = field(default_factory=dict)


def host_path(root: str, path: str) -> str:
    return path if root == "/" else root + path


def dev_node(dev_root: str, path: str) -> DeviceNode:
    """The node `path` (`/dev/...`) at its place under `dev_root` on the host, at `path`
    in the container."""
    if dev_root == DEFAULT_DEV_ROOT:
        return DeviceNode(path)
    return DeviceNode(str(PurePosixPath(dev_root, path.removeprefix("/dev/"))), path)


def numa_node(root: str, bus: str) -> int | None:
    """The NUMA node sysfs gives the PCI device (None: unknown or -1)."""
    try:
        with open(host_path(root, f"/sys/bus/pci/devices/{bus}/numa_node")) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def mig_minors(root: str) -> dict[str, int]:
    """'gpu0/gi1/access' -> 12: the capability device minors of MIG instances."""
    minors: dict[str, int] = {}
    try:
        with open(host_path(root, MIG_MINORS)) as f:
            for line in f:
                name, _, minor = line.strip().rpartition(" ")
                if name and minor.isdigit():
                    minors[name] = int(minor)
    except OSError:
        pass
    return minors


_SLUG = re.compile(r"[^a-z0-9]+")


def model_slug(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    text = model.lower().removeprefix("nvidia ").removeprefix("tesla ").removeprefix("geforce ")
    return _SLUG.sub("-", text).strip("-")[:59].strip("-") or "unknown"


def gpu_resource(gpu: GpuInfo, name: str, spec: NvidiaSpec) -> str:
    if gpu.model in spec.resource_names:
        return spec.resource_names[gpu.model]
    if spec.per_model_names:
        return f"{name.partition('/')[0]}/gpu-{model_slug(gpu.model)}"
    return name


def mig_resource(mig: MigInfo, name: str, spec: NvidiaSpec) -> str:
    """'nvidia.com/mig-1g.10gb.me' for a '1g.10gb+me' device with migStrategy mixed."""
    if spec.mig_strategy == "mixed":
        return f"{name.partition('/')[0]}/{resource_suffix(mig.profile)}"
    return name


def units(
    view: NvmlView, name: str, spec: NvidiaSpec, dev_root: str = DEFAULT_DEV_ROOT
) -> tuple[list[Unit], list[str]]:
    """The units to serve, in GPU order, and one-line warnings about the layout; their
    nodes' host paths under `dev_root`."""
    root = spec.host_root
    shared = tuple(
        dev_node(dev_root, p) for p in SHARED_NODES if os.path.exists(host_path(root, p))
    )
    minors = mig_minors(root) if any(g.mig_enabled for g in view.gpus) else {}
    found: list[Unit] = []
    warnings: list[str] = []
    for gpu in view.gpus:
        numa = numa_node(root, gpu.bus_id)
        gpu_node = dev_node(dev_root, f"/dev/nvidia{gpu.minor}")
        attributes: dict[str, Attribute] = {
            "vendor": "NVIDIA",
            "vendorID": VENDOR_ID,
            "productID": f"0x{gpu.device_id:04x}",
            "model": gpu.model,
            "uuid": gpu.uuid,
            "index": gpu.index,
            "memory": gpu.memory,
            "computeCapability": "{}.{}".format(*gpu.compute_capability),
            "pciAddress": gpu.bus_id,
            "driverVersion": view.driver_version,
            "cudaVersion": view.cuda_version,
        }
        if numa is not None:
            attributes["numaNode"] = numa
        if spec.mig_strategy == "none" or not gpu.mig_enabled:
            if gpu.mig_enabled:
                warnings.append(
                    f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but migStrategy is none: "
                    "served whole"
                )
            resource = gpu_resource(gpu, name, spec)
            found.append(Unit(gpu.uuid, gpu, None, resource, numa, (gpu_node, *shared), attributes))
            continue
        if gpu.mig_problem:
            warnings.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled: {gpu.mig_problem}")
        elif not gpu.migs:
            warnings.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled and no MIG devices")
        for mig in gpu.migs:
            caps = []
            for key in (
                f"gpu{gpu.minor}/gi{mig.gpu_instance}/access",
                f"gpu{gpu.minor}/gi{mig.gpu_instance}/ci{mig.compute_instance}/access",
            ):
                if key in minors:
                    caps.append(dev_node(dev_root, f"/dev/nvidia-caps/nvidia-cap{minors[key]}"))
                else:
                    warnings.append(f"MIG device {mig.uuid}: no {key} in {MIG_MINORS}")
            mig_attributes = dict(attributes, uuid=mig.uuid, memory=mig.memory)
            mig_attributes["migProfile"] = mig.profile
            resource = mig_resource(mig, name, spec)
            nodes = (gpu_node, *caps, *shared)
            found.append(Unit(mig.uuid, gpu, mig, resource, numa, nodes, mig_attributes))
    if spec.mig_strategy == "single":
        profiles = {u.mig.profile for u in found if u.mig is not None}
        whole = [u.gpu.index for u in found if u.mig is None]
        if len(profiles) > 1 or (profiles and whole):
            warnings.append(
                "migStrategy single expects every GPU in MIG mode with one profile; found "
                f"profiles {sorted(profiles)} and {len(whole)} GPU(s) without MIG"
            )
    return found, warnings


def resource_names(view: NvmlView | None, name: str, spec: NvidiaSpec) -> list[str]:
    """The resource's own name first, then the others its GPUs are served under."""
    if view is None:
        return [name]
    found, _ = units(view, name, spec)
    return [name, *sorted({u.resource for u in found} - {name})]


def devices(unit: Unit, spec: NvidiaSpec, healthy: bool) -> list[Device]:
    """The unit's Devices: one per replica, each with the container edits it needs."""
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    cdi: tuple[str, ...] = ()
    if "envvar" in spec.device_list_strategy:
        env[VISIBLE_DEVICES] = unit.uuid
    if "volume-mounts" in spec.device_list_strategy:
        env[VISIBLE_DEVICES] = VOLUME_MOUNTS_DIR
        mounts = (Mount("/dev/null", f"{VOLUME_MOUNTS_DIR}/{unit.uuid}"),)
    if "cdi" in spec.device_list_strategy:
        cdi = (f"{CDI_KIND}={unit.uuid}",)
    return [
        Device(
            device_id,
            healthy,
            numa_nodes=() if unit.numa is None else (unit.numa,),
            nodes=unit.nodes if spec.pass_device_specs else (),
            mounts=mounts,
            env=env,
            cdi_devices=cdi,
            attributes=unit.attributes,
        )
        for device_id in replica_ids(unit.uuid, spec.replicas)
    ]
