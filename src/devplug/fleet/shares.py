"""GPU shares for the scheduler extender on fleet nodes (`replicaPolicy: extender`).

A pool's nodes share one plugin object, so they serve the same GPU UUIDs; the extender
tells nodes apart by the GPUs they publish, so each node publishes its GPUs under IDs
of its own (`node_id`), derived from the node's name and the pool's UUID. A real node's
devplug learns which pod a request is for by listing the pods bound to it; a fleet node
knows it, since it admits one pod at a time: `PoolPlacements.admitting` names the pod
and the GPUs the extender chose for it (its ASSIGNED annotation, read back to the
pool's UUIDs) while the plugin answers.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from devplug.placement.inventory import ASSIGNED, INVENTORY, Inventory, ids
from devplug.sources.nvidia.extender import Match

_IDS = uuid.UUID("5f0c1c8e-6a44-4b7e-9d0e-2f6f3c1d7a10")  # the namespace of node GPU IDs


def node_id(node: str, gpu: str) -> str:
    """The ID node `node` publishes for the pool's GPU `gpu` (a UUID, stable)."""
    return f"GPU-{uuid.uuid5(_IDS, f'{node}/{gpu}')}"


class PoolPlacements:
    """`Placements` for the plugins of one pool: the pod being admitted, if the
    extender placed it."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.current: Match | None = None

    def annotations(self, node: str) -> dict[str, str]:
        """The Node's INVENTORY annotation: the pool's GPUs under the node's own IDs."""
        gpus = tuple(replace(g, id=node_id(node, g.id)) for g in self.inventory.gpus)
        return {INVENTORY: replace(self.inventory, gpus=gpus).encode()}

    @contextlib.contextmanager
    def admitting(self, node: str, pod: Mapping[str, Any]) -> Iterator[None]:
        """While node `node` admits `pod`: requests are for it."""
        meta = pod.get("metadata") or {}
        chosen = ids(((meta.get("annotations") or {}).get(ASSIGNED)) or "")
        pool_ids = {node_id(node, g.id): g.id for g in self.inventory.gpus}
        gpus = tuple(pool_ids[g] for g in chosen if g in pool_ids)
        if gpus:
            namespace = meta.get("namespace") or "default"
            self.current = Match(namespace, str(meta.get("name")), str(meta.get("uid")), gpus)
        try:
            yield
        finally:
            self.current = None

    async def match(self, resource: str, size: int) -> Match | None:
        return self.current

    def given(self, match: Match, gpus: Sequence[str]) -> None:
        """Nothing to write: the pod's GPUs are its ASSIGNED ones, and it is admitted."""
