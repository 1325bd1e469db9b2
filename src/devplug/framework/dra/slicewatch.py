"""A list-and-watch of one node's ResourceSlices of one driver, in a thread, feeding the
event loop: the publisher learns within milliseconds that a slice it owns was deleted
(the kubelet's start-up wipe, an operator) or changed, without polling.

The thread lists, then watches from the list's resource version; when the watch ends
(server timeout, a dropped connection) it watches again from the last version seen,
and when that version is too old (410 Gone) it lists again. Every list replaces the
whole view, so the consumer sees the API server's state, never a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from devplug.apiserver.backoff import CONNECT_TIMEOUT_S, WATCH_MARGIN_S
from devplug.framework import observe

log = logging.getLogger("devplug.dra.slicewatch")

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is started again
RETRY_FIRST_S = 0.5
CACHE_BEHIND_WAIT_S = 0.1  # a 504 "Too large resource version": the cache catches up
RETRY_MAX_S = 30.0

# (objects by name, complete): complete=True after a list (the view is the whole
# state), False for one watch event (the names given changed; None: deleted).
Update = Callable[[Mapping[str, dict[str, Any] | None], bool], None]


class SliceWatch:
    """Calls `on_update` in the event loop with the slices of `driver` on `node`."""

    def __init__(self, api_client: Any, node: str, driver: str, on_update: Update) -> None:
        from kubernetes import client

        self._resource: Any = client.ResourceV1Api(api_client)
        self.driver = driver
        self.selector = f"spec.nodeName={node},spec.driver={driver}"
        self._on_update = on_update
        self._stop = threading.Event()
        self._response: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"watch {self.selector}")
        self._thread.daemon = True  # a watch blocked in a read must not hold the exit
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response, self._response = self._response, None
        if response is not None:
            # Unblocks the thread's read; a failure only means the connection is gone.
            with contextlib.suppress(Exception):
                response.shutdown()

    def _deliver(self, objects: Mapping[str, dict[str, Any] | None], complete: bool) -> None:
        self._call(self._on_update, objects, complete)

    def _call(self, function: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Run `function` in the event loop (the thread only reports)."""
        loop = self._loop
        if loop is None or self._stop.is_set():
            return
        try:
            loop.call_soon_threadsafe(functools.partial(function, *args, **kwargs))
        except RuntimeError:  # the loop is closed: the daemon is exiting
            self._stop.set()

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from devplug.apiserver import failures
        from devplug.apiserver.backoff import Backoff

        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                backoff.reset()
                continue
            except ApiException as error:
                if error.status == 410:  # too old: list again, no wait
                    version = None
                    continue
                if error.status == 504:  # the watch cache is behind the list: a moment
                    version = None
                    self._stop.wait(CACHE_BEHIND_WAIT_S)
                    continue
                failure: Exception = error
            except (HTTPError, OSError, ValueError, failures.Permanent) as error:
                failure = error
            if self._stop.is_set():
                return
            # A permanent failure (not trusted, not allowed) waits for someone to fix
            # it: tried again at the slowest pace, said as an error.
            permanent = failures.kind(failure) == failures.PERMANENT
            delay = RETRY_MAX_S if permanent else backoff.next()
            log.log(
                logging.ERROR if permanent else logging.WARNING,
                "%s: publishing slices failed: cannot list and watch them (%s); retrying in %.1f s",
                self.driver,
                failures.say(failure),
                delay,
            )
            self._call(
                observe.emit,
                observe.SLICES_PUBLISHED,
                self.driver,
                f"publishing slices failed: {failures.say(failure)}",
                logging.DEBUG,
                result="error",
            )
            version = None
            self._stop.wait(delay)

    def _list(self) -> str:
        response = self._resource.list_resource_slice(
            field_selector=self.selector, _preload_content=False
        )
        document = json.loads(response.data)
        items = {item["metadata"]["name"]: item for item in document.get("items") or []}
        self._deliver(items, True)
        return str(document["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Follow the watch until it ends; the last resource version seen."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        response = self._resource.list_resource_slice(
            field_selector=self.selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _request_timeout=(CONNECT_TIMEOUT_S, WATCH_TIMEOUT_S + WATCH_MARGIN_S),
            _preload_content=False,
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                self._deliver({name: None if kind == "DELETED" else obj}, False)
        finally:
            self._response = None
            response.release_conn()
        return version
