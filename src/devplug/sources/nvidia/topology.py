"""Topology-aware choice of GPUs for a multi-GPU container.

A set of GPUs is better when its pairs share more NVLinks, then when more of its
pairs sit under one PCIe switch, then when more share a NUMA node. Ties go to the
lowest GPU indices, so equal choices are the same whatever order the kubelet offers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# NVML topology levels (nvmlGpuTopologyLevel_t): the closest common ancestor of two GPUs.
TOPOLOGY_MULTIPLE = 20  # through PCIe switches only, no host bridge
TOPOLOGY_NODE = 40  # host bridges within one NUMA node
MAX_COMBINATIONS = 20_000  # beyond this, grow the set greedily


@dataclass(frozen=True, slots=True)
class Links:
    """Pairwise connections by GPU index (pairs as (low, high))."""

    nvlinks: Mapping[tuple[int, int], int] = field(default_factory=dict)
    ancestors: Mapping[tuple[int, int], int] = field(default_factory=dict)
    numa: Mapping[int, int | None] = field(default_factory=dict)

    def pair_score(self, a: int, b: int) -> tuple[int, int, int]:
        key = (a, b) if a < b else (b, a)
        level = self.ancestors.get(key)
        same_switch = level is not None and level <= TOPOLOGY_MULTIPLE
        numa_a, numa_b = self.numa.get(a), self.numa.get(b)
        if numa_a is not None and numa_b is not None:
            same_numa = numa_a == numa_b
        else:
            same_numa = level is not None and level <= TOPOLOGY_NODE
        return (self.nvlinks.get(key, 0), int(same_switch), int(same_numa))

    def score(self, gpus: Iterable[int]) -> tuple[int, int, int]:
        total = [0, 0, 0]
        for a, b in itertools.combinations(sorted(gpus), 2):
            for k, value in enumerate(self.pair_score(a, b)):
                total[k] += value
        return (total[0], total[1], total[2])


def best_gpus(
    candidates: Sequence[int], forced: Sequence[int], size: int, links: Links
) -> list[int]:
    """`size` GPU indices out of `candidates`, all of `forced` included, best connected."""
    chosen = sorted(set(forced))
    rest = sorted(set(candidates) - set(chosen))
    need = size - len(chosen)
    if need <= 0:
        return chosen[:size] if need < 0 else chosen
    if _combinations(len(rest), need) <= MAX_COMBINATIONS:
        best: tuple[int, ...] = ()
        best_score = (-1, -1, -1)
        for extra in itertools.combinations(rest, need):
            score = links.score((*chosen, *extra))
            if score > best_score:  # strictly better: the first (lowest indices) wins ties
                best, best_score = extra, score
        return sorted([*chosen, *best])
    while need > 0:  # greedy: the GPU that adds the most to the set so far
        pick = max(rest, key=lambda g: (links.score((*chosen, g)), -g))
        chosen.append(pick)
        rest.remove(pick)
        need -= 1
    return sorted(chosen)


def _combinations(n: int, k: int) -> int:
    from math import comb

    return comb(n, k)
