"""Node labels of the GPUs (node-feature-discovery feature file), named and computed as
NVIDIA's GPU feature discovery does (k8s-device-plugin's internal/lm), so selectors
written for it keep working: product, count, memory, replicas and sharing strategy per
resource (a shared resource's product ends in '-SHARED'), the architecture family from
the compute capability, MIG attributes per MIG resource, `-MIG-INVALID` for a layout
`migStrategy: single` cannot serve, gpu.mode from the PCI class, gpu.machine from DMI,
mig.capable, mps.capable, and the driver and CUDA versions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from devplug.config.ids import physical_id
from devplug.config.nvidia import NvidiaSpec, replicas_of
from devplug.framework.device import Device
from devplug.kube.names import MAX_LABEL_VALUE, label_value
from devplug.sources.nvidia.discovery import Unit, host_path, single_problem
from devplug.sources.nvidia.nvml import GpuInfo, MigInfo
from devplug.sources.nvidia.vgpu import vgpu_labels

if TYPE_CHECKING:
    from devplug.sources.nvidia.source import GpuSource


SHARED_SUFFIX = "-SHARED"
# The architecture by compute capability major, as GPU feature discovery names it.
FAMILIES = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: "volta",
    8: "ampere",
    9: "hopper",
    10: "blackwell",  # Blackwell has two compute capabilities, 10.x and 12.x
    12: "blackwell",
    13: "rubin",
}
# gpu.mode by PCI class: a 3D controller computes, a VGA controller drives displays.
GPU_MODES = {"0x030200": "compute", "0x030000": "graphics"}


def _mib(memory: int) -> str:
    return str(memory // (1024 * 1024))


def _product(*parts: str, shared: bool = False) -> str:
    """The product label value ('NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me'); the '-SHARED'
    suffix survives the length limit."""
    value = label_value("-".join(p.replace("+", ".") for p in parts if p))
    if not shared:
        return value
    room = MAX_LABEL_VALUE - len(SHARED_SUFFIX)
    return value[:room].rstrip("-_.") + SHARED_SUFFIX


def family(major: int, minor: int) -> str:
    if major == 7 and minor >= 5:
        return "turing"  # 7.0 and 7.2 are Volta
    if major == 8 and minor >= 9:
        return "ada-lovelace"  # 8.9: L4, L40S, RTX 40
    return FAMILIES.get(major, "undefined")


def _mig_labels(resource: str, mig: MigInfo) -> dict[str, str]:
    """The MIG device attributes GFD labels a MIG resource with."""
    values = {
        "memory": mig.memory // (1024 * 1024),
        "multiprocessors": mig.multiprocessors,
        "slices.gi": mig.gpu_slices,
        "slices.ci": mig.compute_slices,
        "engines.copy": mig.copy_engines,
        "engines.decoder": mig.decoders,
        "engines.encoder": mig.encoders,
        "engines.jpeg": mig.jpegs,
        "engines.ofa": mig.ofas,
    }
    return {f"{resource}.{key}": str(value) for key, value in values.items()}


def _resource_labels(
    resource: str, product: str, count: int, spec: NvidiaSpec, sharing: bool = True
) -> dict[str, str]:
    """Product, count, replicas and sharing strategy, as GFD labels them: a shared
    resource's product ends in -SHARED unless it is served renamed ('.shared');
    without `sharing` (GFD's labels of MIG-enabled GPUs) replicas are 0."""
    if not sharing:
        return {
            f"{resource}.product": _product(product),
            f"{resource}.count": str(count),
            f"{resource}.replicas": "0",
            f"{resource}.sharing-strategy": "none",
        }
    replicas = replicas_of(spec, resource)
    shared = replicas > 1
    strategy = "mps" if spec.sharing == "mps" else "time-slicing"
    return {
        f"{resource}.product": _product(product, shared=shared and not spec.rename_shared),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy if shared else "none",
    }


def node_labels(
    source: GpuSource, resource: str, primary: bool, devices: Iterable[Device]
) -> dict[str, str]:
    view = source.view
    if view is None:
        return {}
    spec = source.spec
    served = [u for u in source.units if u.resource == resource]
    if not primary:
        return _served_labels(resource, served, spec)
    domain = resource.partition("/")[0]
    gpu = f"{domain}/gpu"
    labels: dict[str, str] = {}
    if view.gpus:
        first = _labelled_gpu(view.gpus)
        count = sum(g.model == first.model for g in view.gpus)  # GFD counts per model
        labels |= _resource_labels(gpu, first.model, count, spec, not first.mig_enabled)
        labels[f"{gpu}.memory"] = _mib(first.memory)
        if spec.mig_strategy == "single" and any(g.mig_enabled for g in view.gpus):
            if single_problem(view):
                labels |= {
                    f"{gpu}.product": _product(first.model, "MIG", "INVALID"),
                    f"{gpu}.count": "0",
                    f"{gpu}.replicas": "0",
                    f"{gpu}.memory": "0",
                }
            else:
                count = len({physical_id(d.id) for d in devices})
                labels |= _served_labels(gpu, served, spec, count)
        major, minor = first.compute_capability
        labels |= {
            f"{gpu}.compute.major": str(major),
            f"{gpu}.compute.minor": str(minor),
            f"{gpu}.family": family(major, minor),
            f"{gpu}.mode": _gpu_mode(source.units),
            f"{gpu}.machine": _machine(spec.host_root, spec.machine_type_file),
        }
    if clique := _clique(view.gpus):
        labels[f"{gpu}.clique"] = clique
    labels |= vgpu_labels(spec.host_root, domain)
    labels[f"{domain}/mig.capable"] = str(any(g.mig_capable for g in view.gpus)).lower()
    if spec.mig_strategy != "none":  # GFD labels a strategy only when there is one
        labels[f"{domain}/mig.strategy"] = spec.mig_strategy
    mps = spec.sharing == "mps" and not any(g.mig_enabled for g in view.gpus)
    labels[f"{domain}/mps.capable"] = str(mps).lower()
    labels |= _version_labels(domain, view.driver_version, view.cuda_version)
    return labels


def _labelled_gpu(gpus: Sequence[GpuInfo]) -> GpuInfo:
    """The GPU whose model GFD's full-GPU labels describe: GFD labels each model and a
    GPU without MIG over one with MIG; between models its order is Go's map order,
    devplug's the lowest index."""
    full = [g for g in gpus if not g.mig_enabled]
    return (full or list(gpus))[0]


def _served_labels(
    resource: str, served: list[Unit], spec: NvidiaSpec, count: int | None = None
) -> dict[str, str]:
    """The labels of a MIG-profile or per-model resource (or of the GPUs' resource under
    `migStrategy: single`), from the first unit it serves."""
    if not served:
        return {}
    first = served[0]
    number = len(served) if count is None else count
    if first.mig is None:
        labels = _resource_labels(resource, first.gpu.model, number, spec)
        labels[f"{resource}.memory"] = _mib(first.gpu.memory)
        return labels
    labels = _resource_labels(resource, f"{first.gpu.model}-MIG-{first.mig.profile}", number, spec)
    return labels | _mig_labels(resource, first.mig)


def _clique(gpus: Sequence[GpuInfo]) -> str:
    """'<cluster UUID>.<clique ID>' of the NVLink fabric the GPUs are attached to, as
    GFD labels it: only when every attached GPU names the same ones."""
    fabrics = {g.fabric for g in gpus if g.fabric is not None}
    if len(fabrics) != 1:
        return ""
    [(cluster, clique)] = fabrics
    return label_value(f"{cluster}.{clique}")


def _gpu_mode(units: list[Unit]) -> str:
    """compute or graphics by the first GPU's PCI class (as GFD: the first one decides)."""
    classes = [u.pci_class for u in units if u.pci_class]
    return GPU_MODES.get(classes[0], "unknown") if classes else "unknown"


def _machine(root: str, path: str) -> str:
    """The machine type from the machine type file (GFD's default: DMI's product name)."""
    try:
        with open(host_path(root, path)) as f:
            text = f.read().strip()
    except OSError:
        return "unknown"
    return label_value(text.replace(" ", "-")) or "unknown"


def _version_labels(domain: str, driver: str, cuda: str) -> dict[str, str]:
    """The driver and CUDA versions, under GFD's names and its deprecated older ones."""
    parts = driver.split(".")
    major, minor = parts[0], parts[1] if len(parts) > 1 else ""
    revision = parts[2] if len(parts) > 2 else ""
    cuda_major, _, cuda_minor = cuda.partition(".")
    values = {
        "cuda.driver-version.full": driver,
        "cuda.driver-version.major": major,
        "cuda.driver-version.minor": minor,
        "cuda.driver-version.revision": revision,
        "cuda.runtime-version.full": cuda,
        "cuda.runtime-version.major": cuda_major,
        "cuda.runtime-version.minor": cuda_minor,
        "cuda.driver.major": major,
        "cuda.driver.minor": minor,
        "cuda.driver.rev": revision,
        "cuda.runtime.major": cuda_major,
        "cuda.runtime.minor": cuda_minor,
    }
    return {f"{domain}/{key}": label_value(v) for key, v in values.items() if label_value(v)}
