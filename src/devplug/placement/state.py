"""A node as placement sees it, device by device, and what a pod asks of it.

The resource model: a GPU is 1000 milli-GPUs. A pod asks for `gpus` GPUs of
`gpu_milli` each: `gpu_milli` 1000 takes that many whole GPUs; `gpu_milli` below 1000
(with `gpus` 1) takes that share of ONE GPU, never parts of two. Several shares fit
one GPU while their sum is at most 1000. CPU is in millicores, memory in any one unit
used for nodes and pods alike (the planner uses MiB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MILLI = 1000

# Why a node does not fit a pod, in the order the checks run. A pod no node fits is
# classed by the furthest check any node passed (the GPUs are there, the CPU is not).
REASON_MODEL = "gpu model"  # no GPU of a model the pod accepts (or no GPU at all)
REASON_WHOLE = "whole gpus"  # fewer whole free GPUs than the pod asks for
REASON_SHARE = "gpu share"  # no single GPU with the pod's share free
REASON_CPU = "cpu"
REASON_MEMORY = "memory"
REASONS = (REASON_MODEL, REASON_WHOLE, REASON_SHARE, REASON_CPU, REASON_MEMORY)
FITS = len(REASONS)  # the stage of a node that fits


@dataclass(frozen=True, slots=True)
class Demand:
    """What one pod asks for. Equal demands are one kind of pod (placement caches
    per kind)."""

    cpu: int = 0
    memory: int = 0
    gpus: int = 0
    gpu_milli: int = 0  # per GPU: 1000 for whole GPUs, less for a share of one
    models: frozenset[str] = frozenset()  # accepted GPU models; empty: any

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu < 0 or self.memory < 0:
            raise ValueError("a demand is never negative")
        if self.gpus and not 0 < self.gpu_milli <= MILLI:
            raise ValueError(f"gpu_milli must be 1 to {MILLI} for a GPU pod")
        if self.gpus > 1 and self.gpu_milli != MILLI:
            raise ValueError("a share of a GPU is a share of one GPU: gpus must be 1")

    @property
    def share(self) -> bool:
        """A share of one GPU (less than a whole one)."""
        return self.gpus == 1 and self.gpu_milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.gpus * self.gpu_milli if self.gpus else 0

    @property
    def kind(self) -> str:
        """'cpu only', 'share', '1 gpu', '2 gpus', ...: how pods are grouped in reports."""
        if not self.gpus:
            return "cpu only"
        if self.share:
            return "share"
        return f"{self.gpus} gpu" + ("s" if self.gpus > 1 else "")


@dataclass(slots=True)
class Node:
    """One node: its capacity and what is free, GPU by GPU (`gpu_free[i]` in milli), and
    how its GPUs are grouped, where that is known: `gpu_link[i]`, GPU i's NVLink group,
    and `gpu_numa[i]`, its NUMA node (-1: none or unknown; empty: nothing known)."""

    name: str
    cpu: int
    memory: int
    model: str = ""
    gpu_free: list[int] = field(default_factory=list)
    cpu_free: int = -1  # -1: all of it
    memory_free: int = -1
    gpu_link: Sequence[int] = ()
    gpu_numa: Sequence[int] = ()

    def __post_init__(self) -> None:
        if self.cpu_free < 0:
            self.cpu_free = self.cpu
        if self.memory_free < 0:
            self.memory_free = self.memory

    @property
    def gpus(self) -> int:
        return len(self.gpu_free)

    def whole_free(self) -> int:
        return self.gpu_free.count(MILLI)

    def stage(self, demand: Demand) -> int:
        """How far the pod gets on this node: the index in REASONS of the first check it
        fails, FITS when it fits."""
        gpus = demand.gpus
        if gpus:
            free = self.gpu_free
            if not free or (demand.models and self.model not in demand.models):
                return 0
            if demand.gpu_milli < MILLI:
                if max(free) < demand.gpu_milli:
                    return 2
            elif free.count(MILLI) < gpus:
                return 1
        if self.cpu_free < demand.cpu:
            return 3
        if self.memory_free < demand.memory:
            return 4
        return FITS

    def fits(self, demand: Demand) -> bool:
        return self.stage(demand) == FITS

    def take(self, demand: Demand, gpus: Sequence[int]) -> None:
        """Give the pod its CPU, memory and the GPUs `gpus` (indices) chosen for it."""
        if len(gpus) != demand.gpus:
            raise ValueError(f"{self.name}: {len(gpus)} GPUs chosen for a pod of {demand.gpus}")
        for index in gpus:
            if self.gpu_free[index] < demand.gpu_milli:
                raise ValueError(f"{self.name}: GPU {index} has not {demand.gpu_milli} milli free")
        self.cpu_free -= demand.cpu
        self.memory_free -= demand.memory
        for index in gpus:
            self.gpu_free[index] -= demand.gpu_milli

    def give_back(self, demand: Demand, gpus: Sequence[int]) -> None:
        """Undo `take` (a pod that left)."""
        self.cpu_free += demand.cpu
        self.memory_free += demand.memory
        for index in gpus:
            self.gpu_free[index] += demand.gpu_milli


def whole_gpus(node: Node, count: int) -> tuple[int, ...]:
    """`count` whole free GPUs of the node: within one NVLink group if one has them,
    else within one NUMA node, else the first ones. Of the groups that hold them, the
    one with the fewest free GPUs (the first of equals), so that a larger group stays
    whole for a larger pod. Without topology: the first `count`."""
    free = [i for i, left in enumerate(node.gpu_free) if left == MILLI]
    if count > 1 and len(free) > count:
        for labels in (node.gpu_link, node.gpu_numa):
            if len(labels) != len(node.gpu_free):
                continue
            groups: dict[int, list[int]] = {}
            for index in free:
                if labels[index] >= 0:
                    groups.setdefault(labels[index], []).append(index)
            holding = [g for g in groups.values() if len(g) >= count]
            if holding:
                return tuple(min(holding, key=lambda g: (len(g), g[0]))[:count])
    return tuple(free[:count])


def tightest_gpu(node: Node, milli: int) -> int:
    """The GPU with the least free that still holds `milli` (the first of equals)."""
    best = -1
    for index, free in enumerate(node.gpu_free):
        if free >= milli and (best < 0 or free < node.gpu_free[best]):
            best = index
    return best


def first_gpu(node: Node, milli: int) -> int:
    """The first GPU that holds `milli`."""
    return next(i for i, free in enumerate(node.gpu_free) if free >= milli)
