"""Node labels of the GPUs (node-feature-discovery feature file), named as NVIDIA's GPU
feature discovery names them, so selectors written for it keep working: a time-sliced
resource's product ends in '-SHARED' as there, so that a pod needing a GPU of its own
can keep off nodes whose GPUs are shared."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from devplug.framework.device import Device
from devplug.framework.preferred import physical_id
from devplug.outputs.nfd import MAX_LABEL_VALUE, label_value

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
}


def _mib(memory: int) -> str:
    return str(memory // (1024 * 1024))


def _product(model: str, shared: bool) -> str:
    """The product label value; the suffix survives the length limit."""
    if not shared:
        return label_value(model)
    room = MAX_LABEL_VALUE - len(SHARED_SUFFIX)
    return label_value(model)[:room].rstrip("-_.") + SHARED_SUFFIX


def family(major: int, minor: int) -> str:
    if major == 7 and minor >= 5:
        return "turing"  # 7.0 and 7.2 are Volta
    return FAMILIES.get(major, "undefined")


def node_labels(
    source: GpuSource, resource: str, primary: bool, devices: Iterable[Device]
) -> dict[str, str]:
    view = source.view
    if view is None:
        return {}
    spec = source.spec
    shared = spec.replicas > 1
    served = [u for u in source.units if u.resource == resource]
    labels: dict[str, str] = {}
    if not primary:
        if served:
            first = served[0]
            product, memory = first.gpu.model, first.gpu.memory
            if first.mig is not None:
                product, memory = f"{product}-MIG-{first.mig.profile}", first.mig.memory
            labels[f"{resource}.count"] = str(len(served))
            labels[f"{resource}.product"] = _product(product, shared)
            labels[f"{resource}.memory"] = _mib(memory)
            labels[f"{resource}.replicas"] = str(spec.replicas)
        return labels
    domain = resource.partition("/")[0]
    gpu = f"{domain}/gpu"
    if view.gpus:
        first_gpu = view.gpus[0]
        product, memory, count = first_gpu.model, first_gpu.memory, len(view.gpus)
        if spec.mig_strategy == "single" and any(u.mig for u in served):
            first_mig = next(u.mig for u in served if u.mig)
            product = f"{product}-MIG-{first_mig.profile}"
            memory, count = first_mig.memory, len({physical_id(d.id) for d in devices})
        major, minor = first_gpu.compute_capability
        labels |= {
            f"{gpu}.product": _product(product, shared),
            f"{gpu}.memory": _mib(memory),
            f"{gpu}.count": str(count),
            f"{gpu}.compute.major": str(major),
            f"{gpu}.compute.minor": str(minor),
            f"{gpu}.family": family(major, minor),
            f"{gpu}.replicas": str(spec.replicas),
            f"{gpu}.sharing-strategy": "time-slicing" if shared else "none",
        }
    labels[f"{domain}/mig.capable"] = str(any(g.mig_capable for g in view.gpus)).lower()
    labels[f"{domain}/mig.strategy"] = spec.mig_strategy
    driver = view.driver_version.split(".")
    labels[f"{domain}/cuda.driver-version.full"] = label_value(view.driver_version)
    for key, part in zip(("major", "minor", "revision"), driver, strict=False):
        labels[f"{domain}/cuda.driver-version.{key}"] = label_value(part)
    cuda_major, _, cuda_minor = view.cuda_version.partition(".")
    labels[f"{domain}/cuda.runtime-version.full"] = view.cuda_version
    labels[f"{domain}/cuda.runtime-version.major"] = cuda_major
    labels[f"{domain}/cuda.runtime-version.minor"] = cuda_minor
    return labels
