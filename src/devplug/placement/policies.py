"""How a node that fits is ranked, and which of its GPUs the pod gets.

A policy scores one node for one pod (higher is better) and names the GPUs it would
take there; the node with the best score wins, the first of equal nodes in cluster
order. Each policy is a pure function of the node's state and the pod: no I/O, no
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

from devplug.placement.fragmentation import TargetWorkload
from devplug.placement.state import MILLI, Demand, Node, first_gpu, tightest_gpu, whole_gpus

MAX_NODE_SCORE = 100

Scored = tuple[float, tuple[int, ...]]


class Policy(Protocol):
    name: str

    def score(self, node: Node, demand: Demand) -> Scored:
        """The node's score for the pod (higher wins) and the GPUs it would get; only
        called for a node the pod fits."""
        ...


def _gpus(node: Node, demand: Demand, share_gpu: int) -> tuple[int, ...]:
    if not demand.gpus:
        return ()
    if demand.share:
        return (share_gpu,)
    return whole_gpus(node, demand.gpus)


def _least_allocated(capacity: int, free: int, request: int) -> int:
    used = capacity - free + request
    if capacity <= 0 or used > capacity:
        return 0
    return (capacity - used) * MAX_NODE_SCORE // capacity


class LeastAllocated:
    """The scheduler's default spreading."""

    name = "default"

    def score(self, node: Node, demand: Demand) -> Scored:
        points = (
            _least_allocated(node.cpu, node.cpu_free, demand.cpu)
            + _least_allocated(node.memory, node.memory_free, demand.memory)
        ) // 2
        share = first_gpu(node, demand.gpu_milli) if demand.share else -1
        return float(points), _gpus(node, demand, share)


class BestFit:
    """Least free CPU and GPU left, each over the largest node's capacity."""

    name = "bestfit"

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.max_cpu = max((n.cpu for n in nodes), default=1) or 1
        self.max_gpu = max((n.gpus for n in nodes), default=1) * MILLI or MILLI

    def score(self, node: Node, demand: Demand) -> Scored:
        left_cpu = node.cpu_free - demand.cpu
        left_gpu = sum(node.gpu_free) - demand.total_milli
        share = tightest_gpu(node, demand.gpu_milli) if demand.share else -1
        return -(0.5 * left_cpu / self.max_cpu + 0.5 * left_gpu / self.max_gpu), _gpus(
            node, demand, share
        )


class Packing:
    """Fill partly used GPUs, then partly used nodes, then open the smallest empty node."""

    name = "packing"

    def score(self, node: Node, demand: Demand) -> Scored:
        if not demand.gpus:
            return -node.cpu_free / max(node.cpu, 1), ()
        whole = node.whole_free()
        if demand.share:
            partly = [f for f in node.gpu_free if demand.gpu_milli <= f < MILLI]
            if partly:
                gpu = tightest_gpu(node, demand.gpu_milli)
                return 2.0 + (MILLI - node.gpu_free[gpu]) / MILLI, (gpu,)
        taken = _gpus(node, demand, tightest_gpu(node, demand.gpu_milli) if demand.share else -1)
        if whole < node.gpus:  # partly used: the fewest whole GPUs left first
            return 1.0 + (1 - (whole - len(taken)) / node.gpus) / 2, taken
        return -node.gpus / 100, taken


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

    def score(self, node: Node, demand: Demand) -> Scored:
        measure = self.target.measure
        before = measure(node.model, node.cpu_free, node.gpu_free)
        cpu_after = node.cpu_free - demand.cpu
        if demand.share:
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
            return float(best_points), (best_gpu,)
        gpus = _gpus(node, demand, -1)
        after_free = list(node.gpu_free)
        for index in gpus:
            after_free[index] = 0
        return float(fgd_points(measure(node.model, cpu_after, after_free) - before)), gpus


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
