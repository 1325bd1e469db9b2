"""Topology-aware choice of GPUs for a multi-GPU container.

A set of GPUs is better when its pairs share more NVLinks, then when more of its
pairs sit under one PCIe switch, then when more share a NUMA node. Ties go to the
lowest GPU indices, so equal choices are the same whatever order the kubelet offers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb

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
    return sorted([*chosen, *_best_extra(chosen, rest, need, links.score)])


def packed_gpus(
    free: Mapping[int, int], forced: Sequence[int], replicas: int, links: Links
) -> list[int]:
    """The fewest GPUs whose `free` replicas (by GPU index) hold `replicas`, all of
    `forced` included: of those, the best connected, then the busiest (fewest free
    replicas in all), so that a request spanning GPUs still gets linked ones and whole
    GPUs stay free for those who need them."""
    chosen = sorted(set(forced))
    rest = sorted(set(free) - set(chosen))
    held = sum(free.get(g, 0) for g in chosen)
    need = 0
    for room in sorted((free[g] for g in rest), reverse=True):  # the roomiest first
        if held >= replicas:
            break
        held += room
        need += 1
    if need == 0:
        return chosen

    def rank(gpus: Sequence[int]) -> tuple[int, ...]:
        total = sum(free.get(g, 0) for g in gpus)
        return (int(total >= replicas), *links.score(gpus), -total)

    return sorted([*chosen, *_best_extra(chosen, rest, need, rank)])


def _best_extra(
    chosen: Sequence[int],
    rest: Sequence[int],
    need: int,
    rank: Callable[[Sequence[int]], tuple[int, ...]],
) -> tuple[int, ...]:
    """The `need` GPUs of `rest` that, with `chosen`, rank highest; ties go to the
    lowest indices (`rest` is sorted). Too many combinations: grown greedily."""
    if comb(len(rest), need) <= MAX_COMBINATIONS:
        best: tuple[int, ...] = ()
        best_rank: tuple[int, ...] | None = None
        for extra in itertools.combinations(rest, need):
            score = rank((*chosen, *extra))
            if best_rank is None or score > best_rank:  # strictly better: first wins ties
                best, best_rank = extra, score
        return best
    picked: list[int] = []
    left = list(rest)
    while len(picked) < need:  # the GPU that adds the most to the set so far
        pick = max(left, key=lambda g: (rank((*chosen, *picked, g)), -g))
        picked.append(pick)
        left.remove(pick)
    return tuple(picked)
