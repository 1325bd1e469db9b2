"""The status of a prepared claim's devices, written into the ResourceClaim: one entry
of `status.devices` per device of this driver, with a `Ready` condition and what a
user looks for (the device ID, its nodes, its CDI names, its attributes: PCI address,
GPU or MIG UUID...). `kubectl get resourceclaim -o yaml` then says which device a pod
got and that it was prepared.

Written by server-side apply with one field manager per driver, so entries of other
drivers are never touched, and an unprepared claim loses exactly ours. The writes
run after NodePrepareResources has answered (the kubelet does not wait for them) and
are retried a few times; a claim that is gone meanwhile is no error.

Kubernetes 1.36 authorizes `status.devices` per driver and node: besides `patch` on
`resourceclaims/status`, the service account needs `associated-node:patch` on
`resourceclaims/driver` for the driver's name (deploy/dra/component/rbac.yaml).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from devplug.api.dra.constants import RESOURCE_API_PATH, RESOURCE_API_VERSION
from devplug.apiserver import failures
from devplug.apiserver.backoff import Backoff
from devplug.framework import observe
from devplug.framework.device import Device
from devplug.framework.dra.driver import ClaimRef

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

log = logging.getLogger("devplug.dra.claimstatus")

READY = "Ready"
_ATTEMPTS = 4
_RETRY_FIRST_S = 0.2
_MAX_DATA_BYTES = 10 * 1024  # the API's limit on `data`


def device_data(device: Device, cdi_ids: Sequence[str]) -> dict[str, Any]:
    """What `data` says of one prepared device."""
    data: dict[str, Any] = {
        "deviceID": device.id,
        "deviceNodes": [n.container_path for n in device.nodes],
        "cdiDeviceIDs": list(cdi_ids),
        "attributes": dict(device.attributes),
    }
    if len(json.dumps(data)) > _MAX_DATA_BYTES:
        del data["attributes"]
    return data


def status_entry(
    driver: str,
    pool: str,
    name: str,
    data: dict[str, Any],
    share_id: str = "",
    now: str | None = None,
) -> dict[str, Any]:
    """One `status.devices` entry (resource.k8s.io/v1 AllocatedDeviceStatus); a share of
    a device shared by capacity is told apart by its share ID."""
    when = now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry: dict[str, Any] = {
        "driver": driver,
        "pool": pool,
        "device": name,
        "conditions": [
            {
                "type": READY,
                "status": "True",
                "reason": "Prepared",
                "message": "prepared by devplug; the CDI devices are in the container",
                "lastTransitionTime": when,
            }
        ],
        "data": data,
    }
    if share_id:
        entry["shareID"] = share_id
    return entry


class ClaimStatusWriter:
    """Writes and clears one driver's entries in claims' status, through devplug's
    client (entered by its owner)."""

    def __init__(self, api: KubeApi, driver: str) -> None:
        self.driver = driver
        self.field_manager = f"devplug/{driver}"[:128]
        self._api = api
        self._tasks: set[asyncio.Task[None]] = set()

    def ready(self, claim: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Write `entries` into the claim's status, in the background."""
        self._spawn(claim, entries)

    def clear(self, claim: ClaimRef) -> None:
        """Remove this driver's entries from the claim's status, in the background."""
        self._spawn(claim, [])

    def _spawn(self, claim: ClaimRef, entries: list[dict[str, Any]]) -> None:
        task = asyncio.create_task(self._write(claim, entries), name=f"status {claim.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _write(self, claim: ClaimRef, entries: list[dict[str, Any]]) -> None:
        from devplug.apiserver.client import APPLY_PATCH, ApiError, Unavailable, explain

        body = {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": entries},
        }
        path = (
            f"{RESOURCE_API_PATH}/namespaces/{claim.namespace}/resourceclaims/{claim.name}/status"
        )
        params = {"fieldManager": self.field_manager, "force": "true"}
        backoff = Backoff(_RETRY_FIRST_S, _RETRY_FIRST_S * 2**_ATTEMPTS)
        for attempt in range(_ATTEMPTS):
            try:
                await self._api.call("PATCH", path, body, params=params, content_type=APPLY_PATCH)
            except ApiError as error:
                if error.status in (404, 409) and not entries:
                    self._tell(claim, "")  # gone, or another claim by now: nothing to clear
                    return
                problem = failures.say(error)
                final = error.status == 404 or not failures.transient(error)
            except (Unavailable, failures.Permanent, ValueError) as error:
                problem, final = explain(error), not failures.transient(error)
            else:
                self._tell(claim, "")
                return
            if final or attempt == _ATTEMPTS - 1:
                log.warning(
                    "%s: cannot write the status of claim %s/%s: %s",
                    self.driver,
                    claim.namespace,
                    claim.name,
                    problem,
                )
                self._tell(claim, problem)
                return
            await asyncio.sleep(backoff.next())

    def _tell(self, claim: ClaimRef, problem: str) -> None:
        """One event per status write, retries included (metrics count them by result)."""
        observe.emit(
            observe.CLAIM_STATUS_WRITTEN,
            self.driver,
            f"status of claim {claim.namespace}/{claim.name} "
            + (f"not written: {problem}" if problem else "written"),
            logging.DEBUG,
            claim=f"{claim.namespace}/{claim.name}",
            result="error" if problem else "ok",
        )
