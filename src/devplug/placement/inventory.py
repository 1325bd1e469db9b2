"""What a node's devplug publishes of its GPUs for the scheduler extender, and what the
extender and the node write on a pod: the Node and Pod annotations, their JSON forms.

A node publishes one annotation, INVENTORY, small and versioned: the resource pods ask
shares through, the milli-GPUs one of its devices is, and per GPU its ID (UUID), model,
capacity in milli, health, MIG devices, NVLink group and NUMA node. The extender writes
ASSIGNED on a pod before it binds it (the GPUs it chose); the node writes GIVEN once the
kubelet allocated them. Pure: no I/O, so both sides and the tests share the one reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devplug.placement.state import MILLI, Demand

INVENTORY = "devplug.io/gpu-inventory"  # on the Node, written by its devplug
ASSIGNED = "devplug.io/gpu-assigned"  # on the Pod, by the extender: GPU IDs, comma-separated
GIVEN = "devplug.io/gpu-given"  # on the Pod, by the node once allocated: the GPU IDs given
VERSION = 1
MAX_TEXT = 64 * 1024  # an inventory larger than this is refused (a node has a few GPUs)


class InventoryError(ValueError):
    """An annotation that cannot be read; the message is one line saying why."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node as the extender sees it."""

    id: str
    model: str
    milli: int = MILLI
    healthy: bool = True
    mig: tuple[str, ...] = ()  # MIG devices' profiles, when MIG is enabled
    nvlink: int = -1  # NVLink group (GPUs linked directly or through others), -1: none
    numa: int = -1  # NUMA node, -1: unknown


@dataclass(frozen=True, slots=True)
class Inventory:
    """A node's GPUs and how pods ask for shares of them."""

    resource: str  # the extended resource pods ask shares through
    unit: int  # milli-GPUs per device (replica) of `resource`
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    def encode(self) -> str:
        """The annotation's value: compact JSON, keys in a fixed order."""
        gpus = []
        for gpu in self.gpus:
            entry: dict[str, Any] = {"id": gpu.id, "model": gpu.model, "milli": gpu.milli}
            if not gpu.healthy:
                entry["healthy"] = False
            if gpu.mig:
                entry["mig"] = list(gpu.mig)
            if gpu.nvlink >= 0:
                entry["nvlink"] = gpu.nvlink
            if gpu.numa >= 0:
                entry["numa"] = gpu.numa
            gpus.append(entry)
        document = {"v": VERSION, "resource": self.resource, "unit": self.unit, "gpus": gpus}
        return json.dumps(document, separators=(",", ":"))

    def milli_of(self, count: int) -> int:
        """The milli-GPUs `count` devices of the resource are."""
        return count * self.unit


def _field(entry: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    value = entry.get(key, default)
    if (
        value is None
        or isinstance(value, bool) is not (kind is bool)
        or not isinstance(value, kind)
    ):
        raise InventoryError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def decode(text: str, where: str = INVENTORY) -> Inventory:
    """Read an INVENTORY annotation; InventoryError naming the field otherwise."""
    if len(text) > MAX_TEXT:
        raise InventoryError(f"{where}: {len(text)} characters, more than {MAX_TEXT}")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise InventoryError(f"{where}: not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InventoryError(f"{where}: expected an object")
    version = document.get("v")
    if version != VERSION:
        raise InventoryError(f"{where}.v: version {version!r}, this extender reads {VERSION}")
    resource = _field(document, "resource", str, where)
    unit = _field(document, "unit", int, where)
    if not 1 <= unit <= MILLI:
        raise InventoryError(f"{where}.unit: expected 1 to {MILLI}, got {unit}")
    entries = _field(document, "gpus", list, where)
    gpus = []
    for index, entry in enumerate(entries):
        at = f"{where}.gpus[{index}]"
        if not isinstance(entry, dict):
            raise InventoryError(f"{at}: expected an object")
        milli = _field(entry, "milli", int, at, MILLI)
        if not 0 < milli <= MILLI:
            raise InventoryError(f"{at}.milli: expected 1 to {MILLI}, got {milli}")
        mig = _field(entry, "mig", list, at, [])
        gpus.append(
            Gpu(
                id=_field(entry, "id", str, at),
                model=_field(entry, "model", str, at),
                milli=milli,
                healthy=_field(entry, "healthy", bool, at, True),
                mig=tuple(str(m) for m in mig),
                nvlink=_field(entry, "nvlink", int, at, -1),
                numa=_field(entry, "numa", int, at, -1),
            )
        )
    return Inventory(resource, unit, tuple(gpus))


def nvlink_groups(count: int, links: Iterable[tuple[int, int]]) -> list[int]:
    """Per GPU index below `count`, its NVLink group: the lowest index of the GPUs it is
    linked to directly or through others; -1 for a GPU linked to none."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    linked: set[int] = set()
    for a, b in links:
        if 0 <= a < count and 0 <= b < count and a != b:
            linked |= {a, b}
            low, high = sorted((root(a), root(b)))
            parent[high] = low
    return [root(i) if i in linked else -1 for i in range(count)]


def demand_of(
    milli: int, models: frozenset[str] = frozenset(), cpu: int = 0, memory: int = 0
) -> Demand:
    """The placement demand of a pod asking `milli` milli-GPUs: a share of one GPU up to
    1000, else whole GPUs; ValueError for more than one GPU that is not whole ones (a
    share never straddles GPUs)."""
    if milli <= 0:
        return Demand(cpu=cpu, memory=memory, models=models)
    if milli <= MILLI:
        return Demand(cpu=cpu, memory=memory, gpus=1, gpu_milli=milli, models=models)
    if milli % MILLI:
        raise ValueError(
            f"{milli} milli-GPUs is more than one GPU and not whole GPUs: a share is of one GPU"
        )
    return Demand(cpu=cpu, memory=memory, gpus=milli // MILLI, gpu_milli=MILLI, models=models)


def ids(value: str) -> list[str]:
    """The GPU IDs of an ASSIGNED or GIVEN annotation."""
    return [part for part in (p.strip() for p in value.split(",")) if part]


def join(gpus: Sequence[str]) -> str:
    return ",".join(gpus)
