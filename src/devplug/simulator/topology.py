"""NUMA alignment as the kubelet's topology manager does it, with device hints only.

The device manager offers, per resource, one hint per set of NUMA nodes that can hold
the request (preferred when the set is as small as the smallest set that could hold it
on an empty node). The policy merges the hints of the container's resources into one
(the narrowest preferred combination) and admits or rejects the pod:

- none: no hints are looked at; every pod is admitted.
- best-effort: the merged hint guides the allocation; every pod is admitted.
- restricted: a pod whose merged hint is not preferred is rejected.
- single-numa-node: only single-node hints count; otherwise as restricted.

NUMA node sets are bit masks (bit n = node n), compared as the kubelet compares them:
fewer nodes first, then the lower mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)
# The topology manager refuses to start on machines with more NUMA nodes than this.
MAX_NUMA_NODES = 8


@dataclass(frozen=True, slots=True)
class TopologyHint:
    # NUMA node mask; None means "no preference" (any node).
    affinity: int | None
    preferred: bool

    def nodes(self) -> list[int]:
        return mask_nodes(self.affinity) if self.affinity is not None else []


# resource -> hints; None: the resource has no topology; []: no NUMA set can hold it.
ResourceHints = Mapping[str, Sequence[TopologyHint] | None]


def mask_of(nodes: Sequence[int]) -> int:
    mask = 0
    for node in nodes:
        if 0 <= node < 64:
            mask |= 1 << node
    return mask


def mask_nodes(mask: int) -> list[int]:
    return [bit for bit in range(64) if mask >> bit & 1]


def any_set(mask: int, nodes: Sequence[int]) -> bool:
    return any(0 <= n < 64 and mask >> n & 1 for n in nodes)


def is_narrower(mask: int, other: int) -> bool:
    """Fewer nodes, or as many nodes and a lower mask."""
    if mask.bit_count() == other.bit_count():
        return mask < other
    return mask.bit_count() < other.bit_count()


def iterate_masks(numa_nodes: Sequence[int]) -> Iterator[int]:
    """Every non-empty set of `numa_nodes`, smallest sets first, in the kubelet's order."""
    for size in range(1, len(numa_nodes) + 1):
        for combination in itertools.combinations(numa_nodes, size):
            yield mask_of(combination)


def device_hints(
    numa_nodes: Sequence[int],
    topology: Mapping[str, Sequence[int]],
    available: Sequence[str],
    reusable: Sequence[str],
    request: int,
) -> list[TopologyHint]:
    """Hints for `request` devices of one resource.

    `topology` maps every device of the resource (healthy or not) to its NUMA nodes;
    `available` are the free healthy devices, `reusable` those an init container of the
    same pod holds.
    """
    min_affinity = len(numa_nodes)
    hints: list[int] = []
    for mask in iterate_masks(numa_nodes):
        in_mask = sum(1 for nodes in topology.values() if any_set(mask, nodes))
        if in_mask >= request and mask.bit_count() < min_affinity:
            min_affinity = mask.bit_count()
        matching = 0
        fits = True
        for device in reusable:
            nodes = topology.get(device, ())
            if not nodes:
                continue
            if not any_set(mask, nodes):
                fits = False
                break
            matching += 1
        if not fits:
            continue
        matching += sum(1 for d in available if any_set(mask, topology.get(d, ())))
        if matching >= request:
            hints.append(mask)
    return [TopologyHint(mask, mask.bit_count() == min_affinity) for mask in hints]


def _provider_hints(hints: ResourceHints) -> list[list[TopologyHint]]:
    """One hint list per resource; no preference and no possibility made explicit."""
    if not hints:
        return [[TopologyHint(None, True)]]
    result = []
    for resource in sorted(hints):
        resource_hints = hints[resource]
        if resource_hints is None:
            result.append([TopologyHint(None, True)])
        elif not resource_hints:
            result.append([TopologyHint(None, False)])
        else:
            result.append(list(resource_hints))
    return result


def _merge_permutation(default: int, permutation: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    merged = default
    first: int | None = None
    for hint in permutation:
        if hint.affinity is not None:
            if first is None:
                first = hint.affinity
            elif hint.affinity != first:
                preferred = False
            merged &= hint.affinity
        if not hint.preferred:
            preferred = False
    return TopologyHint(merged, preferred)


def _narrowest_count(hints: Sequence[TopologyHint]) -> int | None:
    best: int | None = None
    for hint in hints:
        if hint.affinity is None:
            continue
        if best is None or is_narrower(hint.affinity, best):
            best = hint.affinity
    return None if best is None else best.bit_count()


class _Merger:
    def __init__(self, hints: list[list[TopologyHint]]) -> None:
        self.hints = hints
        counts = [c for c in map(_narrowest_count, hints) if c is not None]
        self.best_non_preferred = max(counts, default=0)

    @staticmethod
    def _fitter(current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        assert current.affinity is not None
        assert candidate.affinity is not None
        if candidate.affinity == current.affinity:
            return current
        return current if is_narrower(current.affinity, candidate.affinity) else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        assert candidate.affinity is not None
        if candidate.affinity == 0:
            return current
        if current is None:
            return candidate
        assert current.affinity is not None
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self._fitter(current, candidate)
        # Both not preferred: get as close as possible to (not above) the widest of the
        # narrowest hints any resource offered.
        best = self.best_non_preferred
        cur, cand = current.affinity.bit_count(), candidate.affinity.bit_count()
        if cur > best:
            return self._fitter(current, candidate)
        if cur == best:
            return current if cand != best else self._fitter(current, candidate)
        if cand > best:
            return current
        if cand == best:
            return candidate
        if cand > cur:
            return candidate
        if cand < cur:
            return current
        return self._fitter(current, candidate)

    def merge(self, default: int) -> TopologyHint:
        best: TopologyHint | None = None
        for permutation in itertools.product(*self.hints):
            best = self.compare(best, _merge_permutation(default, permutation))
        return best if best is not None else TopologyHint(default, False)


def merge(
    policy: str, numa_nodes: Sequence[int], hints: ResourceHints
) -> tuple[TopologyHint, bool]:
    """The merged hint for one container's resources, and whether the policy admits it."""
    if policy == POLICY_NONE:
        return TopologyHint(None, True), True
    default = mask_of(numa_nodes)
    provider = _provider_hints(hints)
    if policy == POLICY_SINGLE_NUMA_NODE:
        provider = [
            [
                h
                for h in resource_hints
                if h.preferred and (h.affinity is None or h.affinity.bit_count() == 1)
            ]
            for resource_hints in provider
        ]
    best = _Merger(provider).merge(default)
    if policy == POLICY_SINGLE_NUMA_NODE:
        if best.affinity == default:
            best = TopologyHint(None, best.preferred)
        return best, best.preferred
    if policy == POLICY_RESTRICTED:
        return best, best.preferred
    if policy == POLICY_BEST_EFFORT:
        return best, True
    raise ValueError(f"unknown topology manager policy {policy!r}")
