"""The best node for each pod under one policy, fast enough for a whole cluster.

Scoring every node for every pod is 13 million scores for ten thousand pods on twelve
hundred nodes. A node's score for a kind of pod only changes when the node does, so
the placer keeps, per kind of pod, a heap of the scores it last computed and, on the
next pod of that kind, scores again only the nodes that changed since (a log of
changed nodes); entries of nodes changed after they were pushed are dropped when
they surface. It also keeps, per kind, how far the pod gets on each node, so a pod no
node fits gets its reason class without another pass.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from devplug.placement.policies import Policy
from devplug.placement.state import FITS, REASONS, Demand, Node

COMPACT_FACTOR = 4  # rebuild a heap once it holds this many entries per node


@dataclass(frozen=True, slots=True)
class Choice:
    """Where a pod goes: the node's index in the cluster, its GPUs and its score."""

    node: int
    gpus: tuple[int, ...]
    score: float


@dataclass(slots=True)
class _Kind:
    heap: list[tuple[float, int, int]] = field(default_factory=list)
    seen: int = 0  # position in the change log up to which nodes are scored
    stages: list[int] = field(default_factory=list)
    at_stage: list[int] = field(default_factory=lambda: [0] * (FITS + 1))


class Placer:
    """Places pods one at a time on `nodes` (changed in place) with `policy`."""

    def __init__(self, nodes: Sequence[Node], policy: Policy) -> None:
        self.nodes = list(nodes)
        self.policy = policy
        self._version = [0] * len(self.nodes)
        self._log: list[int] = []
        self._kinds: dict[Demand, _Kind] = {}

    def _score(self, kind: _Kind, index: int, demand: Demand) -> None:
        node = self.nodes[index]
        stage = node.stage(demand)
        kind.at_stage[kind.stages[index]] -= 1
        kind.stages[index] = stage
        kind.at_stage[stage] += 1
        if stage == FITS:
            points = self.policy.score(node, demand)
            heapq.heappush(kind.heap, (-points, index, self._version[index]))

    def _kind(self, demand: Demand) -> _Kind:
        kind = self._kinds.get(demand)
        if kind is None:
            kind = self._kinds[demand] = _Kind()
            kind.stages = [0] * len(self.nodes)
            kind.at_stage[0] = len(self.nodes)
            for index in range(len(self.nodes)):
                self._score(kind, index, demand)
        else:
            for index in set(self._log[kind.seen :]):
                self._score(kind, index, demand)
        kind.seen = len(self._log)
        if len(kind.heap) > COMPACT_FACTOR * max(len(self.nodes), 1):
            kind.heap = [e for e in kind.heap if e[2] == self._version[e[1]]]
            heapq.heapify(kind.heap)
        return kind

    def choose(self, demand: Demand) -> Choice | None:
        """The best node for the pod, or None when no node fits; nothing changes."""
        kind = self._kind(demand)
        heap = kind.heap
        while heap:
            points, index, version = heap[0]
            if version == self._version[index]:
                return Choice(index, self.policy.gpus(self.nodes[index], demand), -points)
            heapq.heappop(heap)
        return None

    def reason(self, demand: Demand) -> str:
        """Why no node fits the pod: the furthest check any node passed (REASONS)."""
        kind = self._kind(demand)
        furthest = max((s for s in range(FITS) if kind.at_stage[s]), default=0)
        return REASONS[furthest]

    def commit(self, demand: Demand, choice: Choice) -> None:
        """Give the pod what `choice` names."""
        self.nodes[choice.node].take(demand, choice.gpus)
        self.changed(choice.node)

    def changed(self, index: int) -> None:
        """Say that node `index` changed outside the placer (a pod left, a GPU failed)."""
        self._version[index] += 1
        self._log.append(index)

    def place(self, demand: Demand) -> Choice | None:
        """Choose and commit; None when no node fits."""
        choice = self.choose(demand)
        if choice is not None:
            self.commit(demand, choice)
        return choice
