"""A fleet's nodes on the API server: the Node objects a kubelet registers (with the
fleet's labels, a node that exists already is taken over only when it is the fleet's),
their Leases and the ResourceSlices of their DRA drivers; and their removal, by label,
each object by its UID (`devplug fleet down`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from devplug.apiserver.client import MERGE_PATCH, ApiError, KubeApi, retrying
from devplug.fleet.calls import FleetCalls
from devplug.fleet.hardware import PoolHardware
from devplug.fleet.objects import (
    FLEET_LABEL,
    LEASE_NAMESPACE,
    fleet_labels,
    lease_body,
    node_body,
    node_status,
    now,
    taints,
)
from devplug.fleet.spec import Pool

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"


async def existing_nodes(calls: FleetCalls) -> dict[str, str]:
    """Node name -> its fleet label ('' for none), for every node of the cluster."""
    found: dict[str, str] = {}
    for item in await calls.list_all("/api/v1/nodes", {}):
        meta = item.get("metadata") or {}
        found[meta.get("name", "")] = (meta.get("labels") or {}).get(FLEET_LABEL, "")
    return found


async def register_node(
    calls: FleetCalls,
    fleet: str,
    name: str,
    pool: Pool,
    hardware: PoolHardware,
    lease_duration_s: int,
    exists: bool,
) -> tuple[str, dict[str, Any]]:
    """Register node `name` (Node, Lease, ResourceSlices); its UID and its Lease."""
    status = node_status(pool, hardware.capacity(), hardware.allocatable(), now())
    body = node_body(name, fleet, pool, hardware.labels, status)
    if hardware.placements is not None:
        body["metadata"]["annotations"] = hardware.placements.annotations(name)
    api = calls.api

    async def create() -> Any:
        if exists:
            await api.call(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": _owned(body["metadata"]), "spec": body["spec"]},
                content_type=MERGE_PATCH,
            )
            return await api.call(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": status},
                content_type=MERGE_PATCH,
            )
        created = await api.call("POST", "/api/v1/nodes", body)
        # Admission adds the not-ready taint at creation; a node lifecycle
        # controller would lift it once Ready, as it is at once here.
        await api.call(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": taints(pool) or None}},
            content_type=MERGE_PATCH,
        )
        return created

    created = await retrying(f"register node {name}", lambda: calls.gated(create))
    uid = str(created["metadata"]["uid"])
    lease = lease_body(name, uid, fleet, pool.name, lease_duration_s)
    lease = await calls.ensure(f"lease of {name}", LEASES, lease)
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
    from devplug.framework.dra.slices import slice_bodies

    for driver in hardware.drivers:
        for piece in slice_bodies(driver, name, 1, owner):
            piece["metadata"]["labels"].update(fleet_labels(fleet, pool.name))
            await calls.ensure(f"slice of {name}", SLICES, piece)
    return uid, lease


def _owned(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a node taken over gets of the Node's metadata: its labels, and its GPU
    inventory where it publishes one (other annotations stay)."""
    return {k: meta[k] for k in ("labels", "annotations") if k in meta}


async def _listed(api: KubeApi, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
    page = await retrying(f"list {path}", lambda: api.call("GET", path, params=params))
    return list(page.get("items") or [])


async def remove_fleet(api: KubeApi, fleet: str) -> dict[str, int]:
    """Delete what `fleet up` created for `fleet` (by its label, each object by its
    UID): Nodes, Leases, ResourceSlices and Events; nothing else. The count of each."""
    selector = {"labelSelector": f"{FLEET_LABEL}={fleet}"}
    collections = {
        "nodes": ("/api/v1/nodes", False),
        "leases": (LEASES, False),
        "resourceslices": (SLICES, False),
        "events": ("/api/v1/events", True),
    }
    removed: dict[str, int] = {}
    gate = asyncio.Semaphore(api.concurrency)
    for kind, (path, namespaced) in collections.items():
        items = await _listed(api, path, selector)

        async def delete(
            item: dict[str, Any], path: str = path, namespaced: bool = namespaced
        ) -> None:
            meta = item["metadata"]
            where = (
                f"/api/v1/namespaces/{meta['namespace']}/events/{meta['name']}"
                if namespaced
                else f"{path}/{meta['name']}"
            )
            body = {"kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"uid": meta["uid"]}}  # fmt: skip
            async with gate:
                with contextlib.suppress(ApiError):
                    await retrying(f"delete {where}", lambda: api.call("DELETE", where, body))

        await asyncio.gather(*(delete(item) for item in items))
        removed[kind] = len(items)
    return removed
