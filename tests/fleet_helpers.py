"""What a fleet test starts, and how it waits on the API server: the `fleets` fixture's
`Fleets`, and `until` that follows a collection through devplug's informer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

from devplug.apiserver.client import KubeApi
from devplug.apiserver.informer import Informer
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
    """The objects at `path` (by name) once `predicate` holds for them, as devplug's
    informer keeps them: a watch the server ends, or a watch cache behind the list, is
    its concern, not each test's."""
    changed = asyncio.Event()
    informer = Informer(
        api,
        path,
        params=params,
        on_list=lambda _items: changed.set(),
        on_event=lambda _kind, _obj: changed.set(),
    )
    informer.start()
    try:
        async with asyncio.timeout(timeout):
            while True:
                await changed.wait()
                changed.clear()
                objects = {o["metadata"]["name"]: o for o in informer.objects.values()}
                if predicate(objects):
                    return objects
    finally:
        await informer.stop()


@contextlib.asynccontextmanager
async def made(api: KubeApi, path: str, body: dict[str, Any]) -> AsyncIterator[None]:
    """An object made at `path` (a collection) for the test, deleted at its end."""
    await api.call("POST", path, body)
    try:
        yield
    finally:
        await api.call("DELETE", f"{path}/{body['metadata']['name']}")
