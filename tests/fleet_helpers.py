"""What a fleet test starts, and how it waits on the API server: the `fleets` fixture's
`Fleets`, and `until` that follows a list's watch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from devplug.apiserver.client import KubeApi
from devplug.fleet.runner import FleetRunner, Options, remove_fleet
from devplug.fleet.spec import Fleet

T = TypeVar("T")
WAIT_S = 30.0
FAST = Options(renew_s=0.3, status_report_s=0.5)


class Fleets:
    """The fleets a test starts, each serving until it is stopped or the test ends, and
    what they stand on (relays, clients, objects made for them). At the end all of it
    is undone, last first, and every fleet's objects are removed through the test's own
    client, which no cut of a relay between a fleet and its API server reaches."""

    def __init__(self, api: KubeApi, folder: Path, stack: contextlib.AsyncExitStack) -> None:
        self.api = api
        self.folder = folder
        self._stack = stack
        self._serving: dict[FleetRunner, tuple[asyncio.Event, asyncio.Task[None] | None]] = {}

    async def enter(self, context: AbstractAsyncContextManager[T]) -> T:
        """Enter `context` until the test's end, left after the fleets started later."""
        return await self._stack.enter_async_context(context)

    async def start(
        self,
        fleet: Fleet,
        client: KubeApi | None = None,
        options: Options = FAST,
        kind: type[FleetRunner] = FleetRunner,
        folder: Path | None = None,
        serve: bool = True,
    ) -> FleetRunner:
        """Start `fleet` (registered, and serving unless `serve` is false) through
        `client`, the test's own by default."""
        self._stack.push_async_callback(remove_fleet, self.api, fleet.name)
        runner = kind(fleet, client or self.api, folder or self.folder, options)
        self._stack.push_async_callback(self.stop, runner)
        self._serving[runner] = (asyncio.Event(), None)
        await runner.start()
        if serve:
            stop, _ = self._serving[runner]
            self._serving[runner] = (stop, asyncio.create_task(runner.serve(stop)))
        return runner

    async def stop(self, runner: FleetRunner) -> None:
        """Stop `runner` serving (its nodes stop with it); again, nothing."""
        stop, task = self._serving.pop(runner, (None, None))
        if stop is None:
            return
        if task is None:
            for node in runner.nodes.values():
                await node.stop()
            return
        stop.set()
        await task


async def until(
    api: KubeApi,
    path: str,
    predicate: Callable[[dict[str, dict[str, Any]]], bool],
    timeout: float = WAIT_S,
    params: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """List, then watch `path` until `predicate(objects by name)` holds."""

    async def follow() -> dict[str, dict[str, Any]]:
        listed = await api.call("GET", path, params=params)
        objects = {o["metadata"]["name"]: o for o in listed["items"]}
        version = listed["metadata"]["resourceVersion"]
        while not predicate(objects):
            async for line in api.watch(path, {**(params or {}), "resourceVersion": version}, 60):
                event = msgspec.json.decode(line)
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] == "DELETED":
                    objects.pop(obj["metadata"]["name"], None)
                else:
                    objects[obj["metadata"]["name"]] = obj
                if predicate(objects):
                    break
        return objects

    return await asyncio.wait_for(follow(), timeout)


@contextlib.asynccontextmanager
async def made(api: KubeApi, path: str, body: dict[str, Any]) -> AsyncIterator[None]:
    """An object made at `path` (a collection) for the test, deleted at its end."""
    await api.call("POST", path, body)
    try:
        yield
    finally:
        await api.call("DELETE", f"{path}/{body['metadata']['name']}")
