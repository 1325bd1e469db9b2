"""The fragmentation measure of "Beware of Fragmentation" (Weng et al., USENIX ATC '23).

Fragmentation is measured against a target workload: the kinds of pods expected, each
with its popularity. For one node and one kind of pod, the free GPU milli that kind
cannot use is fragmented:

- a pod that asks for no GPU uses none of it: all free GPU milli is fragmented;
- a node whose GPU model the pod does not accept, or whose free CPU or GPUs cannot
  hold the pod: all of it;
- a node that can hold the pod: the free milli of each GPU with less free than the
  pod's share of one GPU (a whole-GPU pod: every partly used GPU).

A node's fragmentation is the popularity-weighted sum over the kinds; the cluster's is
the sum over nodes. Memory is not part of the measure (the paper's is over CPU and
GPU). The target workload is the most popular kinds of the pod list, enough of them to
cover 95 % of its pods, their popularity renormalised to sum to one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from devplug.placement.state import MILLI, Demand, Node

COVERAGE = 0.95


@dataclass(frozen=True, slots=True)
class TargetPod:
    demand: Demand
    popularity: float


def _order(item: tuple[Demand, int]) -> tuple[int, int, int, int, tuple[str, ...]]:
    demand, count = item
    return (-count, demand.cpu, demand.gpu_milli, demand.gpus, tuple(sorted(demand.models)))


class TargetWorkload:
    """The kinds of pods fragmentation is measured against, and a memo of the measure
    per node state (a state recurs: nodes of one model fill the same way)."""

    def __init__(self, pods: Sequence[TargetPod]) -> None:
        total = sum(p.popularity for p in pods)
        if not pods or total <= 0:
            raise ValueError("a target workload needs at least one kind of pod")
        self.pods = tuple(TargetPod(p.demand, p.popularity / total) for p in pods)
        # The measure depends on free CPU only through these thresholds.
        self._cpu_steps = sorted({p.demand.cpu for p in self.pods})
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}
        self._thresholds = sorted({p.demand.gpu_milli for p in self.pods if p.demand.gpus})

    @classmethod
    def of(cls, demands: Iterable[Demand], coverage: float = COVERAGE) -> TargetWorkload:
        """The most popular kinds among `demands` covering `coverage` of them (memory
        left out: the measure does not use it)."""
        counts = Counter(
            Demand(d.cpu, 0, d.gpus, d.gpu_milli if d.gpus else 0, d.models) for d in demands
        )
        total = sum(counts.values())
        chosen: list[TargetPod] = []
        covered = 0
        for demand, count in sorted(counts.items(), key=_order):
            if covered >= coverage * total:
                break
            chosen.append(TargetPod(demand, count))
            covered += count
        return cls(chosen)

    def node(self, node: Node) -> float:
        """The node's fragmentation, in milli-GPUs."""
        return self.measure(node.model, node.cpu_free, node.gpu_free)

    def measure(self, model: str, cpu_free: int, gpu_free: Sequence[int]) -> float:
        step = bisect.bisect_right(self._cpu_steps, cpu_free)
        key = (model, step, tuple(sorted(gpu_free)))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._compute(model, cpu_free, key[2])
        return found

    def _compute(self, model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> float:
        total = sum(gpu_free)
        if total == 0:
            return 0.0
        # Per share size: how many GPUs hold it, and the free milli of those that do not.
        holding: dict[int, tuple[int, int]] = {}
        for milli in self._thresholds:
            cut = bisect.bisect_left(gpu_free, milli)
            holding[milli] = (len(gpu_free) - cut, sum(gpu_free[:cut]))
        fragmented = 0.0
        for target in self.pods:
            demand = target.demand
            if (
                not demand.gpus
                or (demand.models and model not in demand.models)
                or cpu_free < demand.cpu
            ):
                fragmented += target.popularity * total
                continue
            gpus, unusable = holding[demand.gpu_milli]
            fragmented += target.popularity * (unusable if gpus >= demand.gpus else total)
        return fragmented

    def describe(self) -> list[dict[str, object]]:
        """The kinds and their popularity, for reports."""
        return [
            {
                "kind": p.demand.kind,
                "cpu_milli": p.demand.cpu,
                "gpus": p.demand.gpus,
                "gpu_milli": p.demand.gpu_milli,
                "models": sorted(p.demand.models),
                "popularity": round(p.popularity, 6),
            }
            for p in self.pods
        ]


def cluster_fragmentation(nodes: Iterable[Node], target: TargetWorkload) -> float:
    """The cluster's fragmentation, in milli-GPUs."""
    return sum(target.node(n) for n in nodes)


__all__ = ["MILLI", "TargetPod", "TargetWorkload", "cluster_fragmentation"]
