"""Publishing a driver's ResourceSlices for this node, kept in step with the devices.

Each change of the plugin's device list (hot-plug, health) is published as a new
pool generation: the slices are created or replaced, and slices of the pool that are
no longer needed deleted. API failures are retried with backoff; the node plugin
keeps serving meanwhile.

Without an API server (the kubelet simulator's claims folder), the slices are written
as documents into that folder instead, where the simulator reads them as the
scheduler would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from devplug.framework.dra.driver import Driver
from devplug.framework.dra.slices import slice_bodies

log = logging.getLogger("devplug.dra.publisher")

_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0


class PoolPublisher:
    """Publishes the node's pool of one driver on every change of its devices."""

    def __init__(self, driver: Driver, node: str) -> None:
        self.driver = driver
        self.node = node
        self.published_generation = 0  # the plugin generation last published
        self.pool_generation = 0
        self._published = asyncio.Event()

    async def wait_published(self, plugin_generation: int) -> None:
        """Wait until the devices of `plugin_generation` (or newer) are published."""
        while self.published_generation < plugin_generation:
            event = self._published
            await event.wait()

    def _sync(self) -> int:
        """Publish the current devices as the next pool generation; returns it."""
        raise NotImplementedError

    def _retried(self) -> tuple[type[BaseException], ...]:
        """The failures a later attempt may overcome."""
        return (OSError,)

    async def run(self) -> None:
        plugin = self.driver.plugin
        await plugin.wait_published()
        retried = self._retried()
        retry = _RETRY_FIRST_S
        while True:
            seen = plugin.generation
            try:
                generation = await asyncio.to_thread(self._sync)
            except retried as error:
                reason = getattr(error, "reason", None) or error
                log.warning(
                    "%s: publishing slices failed (%s); retrying in %.1f s",
                    self.driver.name,
                    reason,
                    retry,
                )
                await asyncio.sleep(retry)
                retry = min(retry * 2, _RETRY_MAX_S)
                continue
            retry = _RETRY_FIRST_S
            healthy = sum(o.device.healthy for o in self.driver.offers().values())
            log.info(
                "%s: published %d device(s) for node %s (pool generation %d)",
                self.driver.name,
                healthy,
                self.node,
                generation,
            )
            self.published_generation = seen
            published, self._published = self._published, asyncio.Event()
            published.set()
            await plugin.wait_changed(seen)


class FolderSlicePublisher(PoolPublisher):
    """The slices as JSON documents in a folder ('<slice name>.json'): the simulator's
    stand-in for the API server, beside the claim documents."""

    def __init__(self, driver: Driver, node: str, folder: Path) -> None:
        super().__init__(driver, node)
        self.folder = folder
        self._written: set[str] = set()

    def _sync(self) -> int:
        from devplug.outputs.files import remove_quietly, write_atomic

        self.pool_generation += 1
        bodies = slice_bodies(self.driver, self.node, self.pool_generation)
        self.folder.mkdir(parents=True, exist_ok=True)
        names = {f"{b['metadata']['name']}.json" for b in bodies}
        for body in bodies:
            data = json.dumps(body, indent=1).encode()
            write_atomic(self.folder / f"{body['metadata']['name']}.json", data, mode=0o644)
        for stale in self._written - names:
            remove_quietly(self.folder / stale)
        self._written = names
        return self.pool_generation


class SlicePublisher(PoolPublisher):
    """The slices on the API server, owned by the Node object."""

    def __init__(self, driver: Driver, node: str, api_client: Any) -> None:
        from kubernetes import client

        super().__init__(driver, node)
        # Any: bodies are plain dicts in the API's JSON form, answers read as JSON.
        self._resource: Any = client.ResourceV1Api(api_client)
        self._core: Any = client.CoreV1Api(api_client)
        self._owner: dict[str, Any] | None = None
        self._owner_known = False

    def _retried(self) -> tuple[type[BaseException], ...]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        return (ApiException, HTTPError, OSError)

    def _node_owner(self) -> dict[str, Any] | None:
        """The Node as owner, so that slices go with their node; None if the API server
        refuses it (a connection failure is raised, and the next attempt asks again)."""
        from kubernetes.client.exceptions import ApiException

        if self._owner_known:
            return self._owner
        try:
            node = self._core.read_node(self.node)
        except ApiException as error:
            log.warning(
                "%s: cannot read node %s (%s): slices get no owner",
                self.driver.name,
                self.node,
                error.reason,
            )
        else:
            self._owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": node.metadata.uid,
            }
        self._owner_known = True
        return self._owner

    def _existing(self) -> dict[str, dict[str, Any]]:
        response = self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self.node},spec.driver={self.driver.name}",
            _preload_content=False,
        )
        items = json.loads(response.data).get("items") or []
        return {item["metadata"]["name"]: item for item in items}

    def _sync(self) -> int:
        """Publish the current devices as the next pool generation; returns it."""
        owner = self._node_owner()
        existing = self._existing()
        generation = max(
            [
                self.pool_generation,
                *(s["spec"]["pool"].get("generation", 0) for s in existing.values()),
            ]
        )
        generation += 1
        bodies = slice_bodies(self.driver, self.node, generation, owner)
        for body in bodies:
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                self._resource.replace_resource_slice(name, body)
            else:
                self._resource.create_resource_slice(body)
        wanted = {b["metadata"]["name"] for b in bodies}
        for name in existing:
            if name not in wanted:
                self._resource.delete_resource_slice(name)
        self.pool_generation = int(generation)
        return self.pool_generation
