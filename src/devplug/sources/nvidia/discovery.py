"""From what NVML sees to what is served: units (GPUs or MIG devices), their resource
names, host files (NUMA node, MIG capability nodes) and the Devices with their edits.

The roots: `hostRoot` is where the daemon reads the host's /dev, /proc and /sys (a
container mounts them elsewhere); the driver's nodes are on the host under `driverRoot`
(looked for under `hostRoot`), unless the config's top-level `devRoot` says where the
runtime finds them (`<devRoot>/nvidia0`), as it does for sysfs devices. The container
path stays `/dev/...`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from devplug.config.hardware import DEFAULT_DEV_ROOT
from devplug.config.ids import replica_ids
from devplug.config.nvidia import CDI_STRATEGIES, NvidiaSpec, cdi_only, replicas_of
from devplug.framework.device import Attribute, Device, DeviceNode, Mount
from devplug.sources.nvidia.mig import resource_suffix
from devplug.sources.nvidia.mps import client_edits
from devplug.sources.nvidia.nvml import GpuInfo, MigInfo, NvmlView

VENDOR_ID = "0x10de"
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"  # the kind NVIDIA's plugin names in Allocate


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
    pci_class: str = ""  # '0x030200' (3D controller), from sysfs


def host_path(root: str, path: str) -> str:
    return path if root == "/" else root + path


def driver_node(spec: NvidiaSpec, path: str, dev_root: str = DEFAULT_DEV_ROOT) -> DeviceNode:
    """A driver device node, at `path` (`/dev/...`) in the container; on the host in the
    config's `devRoot` where one is set, else under `driverRoot`."""
    if dev_root != DEFAULT_DEV_ROOT:
        return DeviceNode(str(PurePosixPath(dev_root, path.removeprefix("/dev/"))), path)
    return DeviceNode(host_path(spec.driver_root, path), path)


def container_id(unit: Unit, spec: NvidiaSpec) -> str:
    """The ID the container is given: the UUID, or the index ('0', '0:1' for the MIG
    device in slot 1 of GPU 0) with `deviceIDStrategy: index`, as NVIDIA's plugin."""
    if spec.device_id_strategy == "uuid":
        return unit.uuid
    if unit.mig is None:
        return str(unit.gpu.index)
    return f"{unit.gpu.index}:{unit.mig.slot}"


def numa_node(root: str, bus: str) -> int | None:
    """The NUMA node sysfs gives the PCI device (None: unknown or -1)."""
    try:
        with open(host_path(root, f"/sys/bus/pci/devices/{bus}/numa_node")) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def pci_class(root: str, bus: str) -> str:
    """The PCI class sysfs gives the device ('0x030200'), '' when unknown."""
    try:
        with open(host_path(root, f"/sys/bus/pci/devices/{bus}/class")) as f:
            return f.read().strip().lower()
    except OSError:
        return ""


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
    on_host = host_path(root, spec.driver_root.rstrip("/"))
    shared = tuple(
        driver_node(spec, p, dev_root) for p in SHARED_NODES if os.path.exists(on_host + p)
    )
    minors = mig_minors(root) if any(g.mig_enabled for g in view.gpus) else {}
    found: list[Unit] = []
    warnings: list[str] = []
    for gpu in view.gpus:
        numa = numa_node(root, gpu.bus_id)
        kind = pci_class(root, gpu.bus_id)
        gpu_node = driver_node(spec, f"/dev/nvidia{gpu.minor}", dev_root)
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
            nodes = (gpu_node, *shared)
            found.append(Unit(gpu.uuid, gpu, None, resource, numa, nodes, attributes, kind))
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
                    cap = f"/dev/nvidia-caps/nvidia-cap{minors[key]}"
                    caps.append(driver_node(spec, cap, dev_root))
                else:
                    warnings.append(f"MIG device {mig.uuid}: no {key} in {MIG_MINORS}")
            mig_attributes = dict(attributes, uuid=mig.uuid, memory=mig.memory)
            mig_attributes["migProfile"] = mig.profile
            resource = mig_resource(mig, name, spec)
            nodes = (gpu_node, *caps, *shared)
            found.append(Unit(mig.uuid, gpu, mig, resource, numa, nodes, mig_attributes, kind))
    return found, warnings


_SMALLER_CI = re.compile(r"[0-9]+c\.")


def layout_problem(view: NvmlView, spec: NvidiaSpec) -> str:
    """Why NVIDIA's plugin would not start on this MIG layout ('' when it would): MPS
    with MIG devices; with `single`, GPUs with and without MIG, an empty MIG GPU or two
    profiles (it would serve a MIG slice as a whole GPU); with `mixed` and NVIDIA's
    config file, a compute instance smaller than its GPU instance, which no resource of
    NVIDIA's matches."""
    migs = any(g.mig_enabled and g.migs for g in view.gpus)
    if spec.sharing == "mps" and spec.mig_strategy != "none" and migs:
        return "sharing using MPS is not supported for MIG devices"
    if spec.mig_strategy == "single" and (problem := single_problem(view)):
        return f"migStrategy single needs every GPU in MIG mode with one profile: {problem}"
    if spec.mig_strategy == "mixed" and spec.nvidia_config is not None:
        for gpu in view.gpus:
            for mig in gpu.migs if gpu.mig_enabled else ():
                if _SMALLER_CI.match(mig.profile):
                    return (
                        f"MIG profile {mig.profile!r} of GPU {gpu.index} does not match any "
                        "resource patterns (a compute instance smaller than its GPU instance)"
                    )
    return ""


def single_problem(view: NvmlView) -> str:
    """Why `migStrategy: single` cannot serve this layout ('' when it can), as GPU feature
    discovery says it: an empty MIG-enabled GPU, GPUs with and without MIG, or more than
    one profile."""
    enabled = [g for g in view.gpus if g.mig_enabled]
    if not enabled:
        return ""
    if any(not g.migs for g in enabled):
        return "at least one MIG device is enabled but empty"
    if len(enabled) != len(view.gpus):
        return "devices with MIG enabled and disabled detected"
    if len({m.profile for g in enabled for m in g.migs}) > 1:
        return "more than one MIG device type present on node"
    return ""


def resource_names(view: NvmlView | None, name: str, spec: NvidiaSpec) -> list[str]:
    """The resource's own name first, then the others its GPUs are served under."""
    if view is None:
        return [name]
    found, _ = units(view, name, spec)
    return [name, *sorted({u.resource for u in found} - {name})]


def devices(unit: Unit, spec: NvidiaSpec, healthy: bool, reason: str = "") -> list[Device]:
    """The unit's Devices: one per replica, each with the container edits it needs
    (and, unhealthy, why: `reason`). With CDI strategies only, the container gets CDI
    names and no device list env or device specs, as from NVIDIA's plugin (MPS's
    folders and the GDS/MOFED/GDRCOPY switches still)."""
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    cdi: tuple[str, ...] = ()
    ident = container_id(unit, spec)
    only_cdi = cdi_only(spec)
    if "envvar" in spec.device_list_strategy:
        env[VISIBLE_DEVICES] = ident
    if "volume-mounts" in spec.device_list_strategy:
        env[VISIBLE_DEVICES] = VOLUME_MOUNTS_DIR
        mounts = (Mount("/dev/null", f"{VOLUME_MOUNTS_DIR}/{ident}"),)
    for name, on in (  # sent with CDI strategies alone too, as NVIDIA's plugin does
        ("NVIDIA_GDS", spec.gds_enabled),
        ("NVIDIA_MOFED", spec.mofed_enabled),
        ("NVIDIA_GDRCOPY", spec.gdrcopy_enabled),
    ):
        if on:
            env[name] = "enabled"
    if any(s in CDI_STRATEGIES for s in spec.device_list_strategy):
        cdi = (f"{CDI_KIND}={ident}",)
    if spec.sharing == "mps":
        mps_env, mps_mounts = client_edits(unit.resource, spec)
        env |= mps_env
        mounts += mps_mounts
    return [
        Device(
            device_id,
            healthy,
            numa_nodes=() if unit.numa is None else (unit.numa,),
            nodes=unit.nodes if spec.pass_device_specs and not only_cdi else (),
            mounts=mounts,
            env=env,
            cdi_devices=cdi,
            attributes=unit.attributes,
            health_reason="" if healthy else reason,
        )
        for device_id in replica_ids(unit.uuid, replicas_of(spec, unit.resource))
    ]
