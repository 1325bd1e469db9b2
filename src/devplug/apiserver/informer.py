"""List and watch one collection of the API server, as a Kubernetes informer's reflector
does, in the event loop: the one way devplug keeps a view of objects current.

It lists (the whole state, replacing the view at once), then watches from the list's
resource version, bookmarks asked for; when the server ends the watch (its timeout, a
dropped connection) it watches again from the last version seen (an event's, or a
bookmark's), so nothing that changed in between is missed. When that version is too
old (410 Expired) it lists again at once; when the server's watch cache is behind the
list (504 "Too large resource version") it lists again after a moment; any other
failure (the API server away) lists again after a jittered backoff, at the slowest pace
for a permanent one (not trusted, not allowed), while the view keeps the last state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from devplug.apiserver import failures
from devplug.apiserver.backoff import Backoff

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

log = logging.getLogger("devplug.apiserver.informer")

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is started again
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
CACHE_BEHIND_WAIT_S = 0.1  # a 504 "Too large resource version": the cache catches up
CHANGES = ("ADDED", "MODIFIED", "DELETED")

Object = dict[str, Any]


def key(obj: Mapping[str, Any]) -> str:
    """ "namespace/name" of a namespaced object, "name" of a cluster-wide one."""
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def expired(error: BaseException) -> bool:
    """410 Gone: the watch's resource version is too old; list again."""
    from devplug.apiserver.client import ApiError

    return isinstance(error, ApiError) and (
        error.status == 410 or "too old resource version" in error.message.lower()
    )


def behind(error: BaseException) -> bool:
    """504 "Too large resource version": the server's watch cache is behind the list."""
    from devplug.apiserver.client import ApiError

    return (
        isinstance(error, ApiError)
        and error.status == 504
        and "too large resource version" in error.message.lower()
    )


class Informer:
    """Keeps `objects` (by `key`) current with the collection at `path` (`params`: its
    label and field selectors); `synced` is set once it has listed.

    `on_list(items)` is called after each list (the whole state), `on_event(type,
    object)` after each change applied (ADDED, MODIFIED, DELETED), `on_failure(error)`
    after each failed attempt, in the event loop.
    """

    def __init__(
        self,
        api: KubeApi,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        what: str | None = None,
        on_list: Callable[[list[Object]], None] | None = None,
        on_event: Callable[[str, Object], None] | None = None,
        on_failure: Callable[[Exception], object] | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self.api = api
        self.path = path
        self.params = dict(params or {})
        self.what = what or path
        self.on_list = on_list
        self.on_event = on_event
        self.on_failure = on_failure
        self.watch_timeout_s = watch_timeout_s
        self.objects: dict[str, Object] = {}
        self.synced = asyncio.Event()
        self.version: str | None = None  # the last resource version seen
        self.lists = 0  # lists done (1 + relists), for tests and logs
        self.watches = 0  # watches opened
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        """Run in a task of the running event loop until `stop()`."""
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"informer {self.what}"
        )
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        failed = False
        while True:
            try:
                if self.version is None:
                    await self._list()
                await self._follow()
            except Exception as error:  # the API server's failures, each handled below
                if expired(error):
                    log.info("%s: the watch's version is too old: listing again", self.what)
                    self.version = None
                    continue
                if behind(error):
                    self.version = None
                    await asyncio.sleep(CACHE_BEHIND_WAIT_S)
                    continue
                failed = True
                await self._failed(error, backoff)
                continue
            if failed:
                log.info("%s: listed and watched again", self.what)
                failed = False
            backoff.reset()

    async def _failed(self, error: Exception, backoff: Backoff) -> None:
        """Say it in one line, then wait before listing again."""
        # A permanent failure (not trusted, not allowed) waits for someone to fix it:
        # tried again at the slowest pace, said as an error.
        permanent = failures.kind(error) == failures.PERMANENT
        delay = RETRY_MAX_S if permanent else backoff.next()
        log.log(
            logging.ERROR if permanent else logging.WARNING,
            "%s: cannot list and watch them (%s); the last state is kept, retrying in %.1f s",
            self.what,
            _say(error),
            delay,
        )
        if self.on_failure is not None:
            self.on_failure(error)
        self.version = None
        await asyncio.sleep(delay)

    async def _list(self) -> None:
        document = await self.api.call("GET", self.path, params=self.params or None)
        items: list[Object] = document.get("items") or []
        version = str((document.get("metadata") or {}).get("resourceVersion") or "")
        self.objects = {key(item): item for item in items}
        self.lists += 1
        self.version = version
        if self.on_list is not None:
            self.on_list(items)
        self.synced.set()

    async def _follow(self) -> None:
        """Follow one watch until the server ends it, keeping the last version seen."""
        from devplug.apiserver.client import ApiError

        assert self.version is not None
        query = {**self.params, "resourceVersion": self.version, "allowWatchBookmarks": "true"}
        self.watches += 1
        async for line in self.api.watch(self.path, query, self.watch_timeout_s):
            event = msgspec.json.decode(line)
            kind, obj = str(event.get("type")), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(
                    int(obj.get("code") or 500),
                    str(obj.get("message", "")),
                    str(obj.get("reason", "")),
                )
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.version = str(version)
            if kind not in CHANGES:
                continue  # a BOOKMARK: only its version counts
            if kind == "DELETED":
                self.objects.pop(key(obj), None)
            else:
                self.objects[key(obj)] = obj
            if self.on_event is not None:
                self.on_event(kind, obj)


def _say(error: Exception) -> str:
    if isinstance(error, msgspec.DecodeError):
        return f"an answer that is not JSON: {error}"
    from devplug.apiserver.client import Unavailable, explain

    if isinstance(error, Unavailable):
        return explain(error)
    return failures.say(error)
