"""List and watch one kind of object in a thread, as a Kubernetes informer's reflector
does, feeding a store: the extender's cache of Nodes and pods.

The thread lists (the whole state, given to the store at once), then watches from the
list's resource version; when the server ends the watch (its timeout, a dropped
connection) it watches again from the last version seen (an event, or a bookmark), so
nothing that changed in between is missed. When that version is too old (410 Gone) it
lists again; when the server's watch cache is behind the list (504) it lists again
after a moment; any other failure (the API server away) lists again after a backoff,
while the store keeps the last state it was given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from devplug.apiserver.backoff import Backoff

log = logging.getLogger("devplug.extender")

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is started again
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
CACHE_BEHIND_WAIT_S = 0.1  # a 504: the server's watch cache catches up


class Watch(Protocol):
    def events(self) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def close(self) -> None: ...


class Source(Protocol):
    """The lists and watches of the API server (devplug.extender.kubeapi.KubeApi)."""

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch(self, kind: str, version: str, timeout_s: int) -> Watch: ...


class Store(Protocol):
    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        """The whole state of `kind`, after a list."""
        ...

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """One change: ADDED, MODIFIED or DELETED."""
        ...


class Informer:
    """Keeps `store` current with the objects of `kind`."""

    def __init__(
        self, source: Source, kind: str, store: Store, watch_timeout_s: int = WATCH_TIMEOUT_S
    ) -> None:
        self.source = source
        self.kind = kind
        self.store = store
        self.watch_timeout_s = watch_timeout_s
        self.lists = 0  # lists done (1 + relists), for tests and logs
        self.watches = 0  # watches started
        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer {self.kind}")
        self._thread.daemon = True  # a watch blocked in a read must not hold the exit
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        from devplug.apiserver import failures
        from devplug.extender.kubeapi import Behind, Expired

        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._follow(version)
                backoff.reset()
                continue
            except Expired:
                log.info("%s: the watch's version is too old: listing again", self.kind)
                version = None
                continue
            except Behind:
                version = None
                self._stop.wait(CACHE_BEHIND_WAIT_S)
                continue
            except Exception as error:  # the API server's failures, said in one line
                failure = error
            if self._stop.is_set():
                return
            delay = backoff.next()
            log.warning(
                "%s: cannot list and watch them (%s); the last state is kept, retrying in %.1f s",
                self.kind,
                failures.say(failure),
                delay,
            )
            version = None
            self._stop.wait(delay)

    def _list(self) -> str:
        items, version = self.source.list(self.kind)
        self.lists += 1
        self.store.replace(self.kind, items)
        return version

    def _follow(self, version: str) -> str:
        """Follow one watch until it ends; the last resource version seen."""
        watch = self.source.watch(self.kind, version, self.watch_timeout_s)
        self._watch = watch
        self.watches += 1
        if self._stop.is_set():  # stopped while the watch was opened
            watch.close()
        try:
            for event, obj in watch.events():
                if self._stop.is_set():
                    break
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if event in ("ADDED", "MODIFIED", "DELETED"):
                    self.store.apply(self.kind, event, obj)
        finally:
            self._watch = None
        return version
