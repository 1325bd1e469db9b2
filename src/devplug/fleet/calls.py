"""The fleet's calls to the API server: reads and writes through two shares of the
session's connections (one kept for the Leases, so that a burst of pod statuses never
makes a node miss its renewals), retried while the API server is away, and writes
that must land kept track of until they do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from devplug.apiserver.client import ApiError, KubeApi, Unavailable, retrying

log = logging.getLogger("devplug.fleet")

LIST_PAGE = 500


class FleetCalls:
    """Calls over `api`; `stop` (set when the fleet stops) ends the retries of writes."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        lease_share = max(1, api.concurrency // 4)
        self.lease_gate = asyncio.Semaphore(lease_share)
        self._gate = asyncio.Semaphore(max(1, api.concurrency - lease_share))
        self._writes: set[asyncio.Task[None]] = set()
        self.stop = asyncio.Event()

    async def gated(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async with self._gate:
            return await call()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """A read, waiting for the API server if it is away."""
        return await retrying(f"GET {path}", lambda: self.api.call("GET", path, params=params))

    async def list_all(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        items, _ = await self.list_with_version(path, params)
        return items

    async def list_with_version(
        self, path: str, params: Mapping[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item, page by page, and the version of the list."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = dict(params, limit=str(LIST_PAGE))
            if token:
                query["continue"] = token
            page = await self.get(path, query)
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    async def ensure(self, what: str, collection: str, body: dict[str, Any]) -> Any:
        """`put`, waiting for the API server if it is away."""
        return await retrying(what, lambda: self.gated(lambda: self.put(collection, body)))

    async def put(self, collection: str, body: dict[str, Any]) -> Any:
        """Create the object, or replace the one of the same name."""
        try:
            return await self.api.call("POST", collection, body)
        except ApiError as error:
            if error.status != 409:
                raise
        path = f"{collection}/{body['metadata']['name']}"
        current = await self.api.call("GET", path)
        body = dict(body, metadata=dict(body["metadata"]))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return await self.api.call("PUT", path, body)

    def write(self, what: str, call: Callable[[], Awaitable[Any]]) -> None:
        """A write that must reach the API server: retried while it is away; a pod or
        node that is gone meanwhile ends it quietly."""

        async def run() -> None:
            try:
                await retrying(what, lambda: self.gated(call), stop=self.stop)
            except ApiError as error:
                if error.status not in (404, 409):
                    log.warning("%s: %s", what, error)
            except Unavailable as error:
                log.warning("%s: given up at shutdown: %s", what, error)

        task = asyncio.create_task(run())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the writes in flight."""
        pending = set(self._writes)
        if pending:
            await asyncio.wait(pending, timeout=timeout)
