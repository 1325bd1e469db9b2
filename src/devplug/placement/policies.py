"""How a node that fits is ranked, and which of its GPUs the pod gets.

A policy scores one node for one pod (higher is better); the node with the best score
wins, the first of equal nodes in cluster order, and the policy names the GPUs the pod
takes there. Each policy is a pure function of the node's state and the pod: no I/O, no
clock, no randomness.

- `default`: the scheduler's default, LeastAllocated over CPU and memory (integer
  scores 0-100, averaged), blind to GPUs; a share goes to the node's first GPU with room,
  whole GPUs are the first free ones (what a device plugin without preferences gives).
- `bestfit`: the node left with the least, by a weighted sum of free CPU and free GPU
  after the pod (half each, each over the largest node's capacity); a share goes to
  the GPU with the least room that holds it.
- `packing`: partly used GPUs first (the fullest that holds the share), then partly
  used nodes (the fewest whole GPUs left), then empty nodes (the smallest); a pod
  without GPUs goes where the least CPU is left.
- `fgd`: Fragmentation Gradient Descent: the node, and for a share the GPU, whose
  fragmentation against the target workload grows least (`fragmentation`), scored
  0-100 as the paper's scheduler plugin does (`fgd_points`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from devplug.kube.scoring import MAX_NODE_SCORE, least_allocated
from devplug.placement.fragmentation import TargetWorkload
from devplug.placement.state import MILLI, Demand, Node, first_gpu, tightest_gpu, whole_gpus


class Policy(Protocol):
    name: str

    def score(self, node: Node, demand: Demand) -> float:
        """The node's score for the pod, higher wins; only called for a node the pod fits."""
        ...

    def gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        """The GPUs (indices) the pod takes on the node it fits."""
        ...


def _gpus(node: Node, demand: Demand, share_gpu: int) -> tuple[int, ...]:
    if not demand.gpus:
        return ()
    if demand.share:
        return (share_gpu,)
    return whole_gpus(node, demand.gpus)


class LeastAllocated:
    """The scheduler's default spreading."""

    name = "default"

    def score(self, node: Node, demand: Demand) -> float:
        return float(
            (
                least_allocated(node.cpu, node.cpu - node.cpu_free + demand.cpu)
                + least_allocated(node.memory, node.memory - node.memory_free + demand.memory)
            )
            // 2
        )

    def gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return _gpus(node, demand, first_gpu(node, demand.gpu_milli) if demand.share else -1)


class BestFit:
    """Least free CPU and GPU left, each over the largest node's capacity."""

    name = "bestfit"

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.max_cpu = max((n.cpu for n in nodes), default=1) or 1
        self.max_gpu = max((n.gpus for n in nodes), default=1) * MILLI or MILLI

    def score(self, node: Node, demand: Demand) -> float:
        left_cpu = node.cpu_free - demand.cpu
        left_gpu = sum(node.gpu_free) - demand.total_milli
        return -(0.5 * left_cpu / self.max_cpu + 0.5 * left_gpu / self.max_gpu)

    def gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return _gpus(node, demand, tightest_gpu(node, demand.gpu_milli) if demand.share else -1)


class Packing:
    """Fill partly used GPUs, then partly used nodes, then open the smallest empty node."""

    name = "packing"

    def score(self, node: Node, demand: Demand) -> float:
        if not demand.gpus:
            return -node.cpu_free / max(node.cpu, 1)
        whole = node.whole_free()
        if demand.share:
            gpu = tightest_gpu(node, demand.gpu_milli)
            if node.gpu_free[gpu] < MILLI:  # a partly used GPU holds it
                return 2.0 + (MILLI - node.gpu_free[gpu]) / MILLI
        if whole < node.gpus:  # a partly used node: the fewest whole GPUs left first
            taken = 0 if demand.share else demand.gpus
            return 1.0 + (1 - (whole - taken) / node.gpus) / 2
        return -node.gpus / 100

    def gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return _gpus(node, demand, tightest_gpu(node, demand.gpu_milli) if demand.share else -1)


def fgd_points(growth: float) -> int:
    """FGD's node score as the scheduler's plugins give it, 0-100: 100 * sigmoid(-growth),
    the fragmentation growth in GPUs, rounded down (so nearly equal growths tie, and the
    first node takes the tie)."""
    return int(MAX_NODE_SCORE / (1 + math.exp(growth / MILLI)))


class FragmentationGradientDescent:
    """FGD: the smallest growth of the node's fragmentation; for a share, the GPU that
    scores best (the first of equals)."""

    name = "fgd"

    def __init__(self, target: TargetWorkload) -> None:
        self.target = target

    def _share(self, node: Node, demand: Demand) -> tuple[int, int]:
        """The best points of a share on the node, and its GPU."""
        measure = self.target.measure
        before = measure(node.model, node.cpu_free, node.gpu_free)
        cpu_after = node.cpu_free - demand.cpu
        best_points, best_gpu, tried = -1, -1, set()
        for index, free in enumerate(node.gpu_free):
            if free < demand.gpu_milli or free in tried:
                continue
            tried.add(free)
            after_free = list(node.gpu_free)
            after_free[index] = free - demand.gpu_milli
            points = fgd_points(measure(node.model, cpu_after, after_free) - before)
            if points > best_points:
                best_points, best_gpu = points, index
        return best_points, best_gpu

    def score(self, node: Node, demand: Demand) -> float:
        if demand.share:
            return float(self._share(node, demand)[0])
        measure = self.target.measure
        before = measure(node.model, node.cpu_free, node.gpu_free)
        after_free = list(node.gpu_free)
        for index in _gpus(node, demand, -1):
            after_free[index] = 0
        after = measure(node.model, node.cpu_free - demand.cpu, after_free)
        return float(fgd_points(after - before))

    def gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return _gpus(node, demand, self._share(node, demand)[1] if demand.share else -1)


POLICY_NAMES = ("default", "bestfit", "packing", "fgd")


def make_policy(name: str, nodes: Sequence[Node], target: TargetWorkload | None) -> Policy:
    """The policy called `name` for these nodes (FGD needs the target workload)."""
    if name == "default":
        return LeastAllocated()
    if name == "bestfit":
        return BestFit(nodes)
    if name == "packing":
        return Packing()
    if name == "fgd":
        if target is None:
            raise ValueError("fgd needs a target workload")
        return FragmentationGradientDescent(target)
    raise ValueError(f"unknown policy {name!r}: one of {', '.join(POLICY_NAMES)}")
