"""Where the node plugin reads a claim's allocation: the API server, or a folder of
claim documents (for the kubelet simulator without an API server).

Both give the claim as the API server's JSON form (a dict); `allocated_devices`
picks the results that belong to one driver's pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from devplug.api.dra.constants import RESOURCE_API_PATH
from devplug.framework.dra.driver import AllocatedDevice, ClaimRef
from devplug.ground import inputs

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi


class ClaimError(Exception):
    """The claim cannot be prepared; the message goes to the kubelet."""


class ClaimSource(Protocol):
    async def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        """The claim's object; raises ClaimError."""
        ...


def allocated_devices(
    claim: ClaimRef, obj: Mapping[str, Any], driver: str, pool: str
) -> list[AllocatedDevice]:
    """The allocation results of `obj` for `driver` in `pool`, after checking that
    `obj` is the claim the kubelet named (same UID) and that it is allocated."""
    uid = (obj.get("metadata") or {}).get("uid")
    if uid != claim.uid:
        raise ClaimError(
            f"ResourceClaim {claim.namespace}/{claim.name} has UID {uid}, not {claim.uid}"
        )
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        AllocatedDevice(
            str(r.get("request", "")),
            str(r["pool"]),
            str(r["device"]),
            str(r.get("shareID") or ""),
            {str(k): str(v) for k, v in (r.get("consumedCapacity") or {}).items()},
            bool(r.get("adminAccess")),
            tuple(t for t in r.get("tolerations") or () if isinstance(t, Mapping)),
        )
        for r in results
        if r.get("driver") == driver and r.get("pool") == pool
    ]


class ApiClaims:
    """Claims read from the API server through devplug's client (entered by its owner),
    once per call: a claim that cannot be read fails the prepare, and the kubelet asks
    again."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    async def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        from devplug.apiserver.client import FAILURES, explain

        path = f"{RESOURCE_API_PATH}/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        try:
            document = await self._api.call("GET", path)
        except (*FAILURES, ValueError) as error:  # ValueError: an answer that is not JSON
            raise ClaimError(
                f"cannot read ResourceClaim {claim.namespace}/{claim.name}: {explain(error)}"
            ) from None
        if not isinstance(document, Mapping):
            raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name}: not an object")
        return document


class FileClaims:
    """Claims kept as YAML or JSON documents (kind ResourceClaim) in a folder: the
    simulator's stand-in for the API server, as its pod list is."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    async def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        return await asyncio.to_thread(self._find, claim)

    def _find(self, claim: ClaimRef) -> Mapping[str, Any]:
        for doc in folder_documents(self.folder, "ResourceClaim"):
            meta = doc.get("metadata") or {}
            if (meta.get("namespace") or "default", meta.get("name")) == (
                claim.namespace,
                claim.name,
            ):
                return doc
        raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} not found in {self.folder}")


def folder_documents(folder: Path, kind: str) -> Iterator[Mapping[str, Any]]:
    """The objects of `kind` in the YAML and JSON files of `folder` (unreadable files
    are skipped: another writer may be halfway through one)."""
    for path in sorted(folder.glob("*")):
        if path.suffix not in (".yaml", ".yml", ".json"):
            continue
        try:
            documents = inputs.load_yaml_all(inputs.read_text(path), str(path))
        except inputs.InputError:
            continue
        for doc in documents:
            if isinstance(doc, Mapping) and doc.get("kind") == kind:
                yield doc
