"""Publishing a driver's ResourceSlices for this node and keeping them so.

The publisher is a reconciler: it knows the slices it wants (from the plugin's
devices) and, through a watch, the slices the API server has; whenever either
changes it makes the second match the first. A slice deleted by someone else (the
kubelet deletes every slice of its node when it starts) is created again, one edited
by someone else is put back, within the time of one API call; nothing polls.

Each change of the devices is published as a new pool generation; a restored slice
keeps the generation it had. During a rolling update two devplug pods publish the
same pool: each stamps its slices, and the older one leaves alone a slice the newer
one wrote, so the two never take turns rewriting it. API failures are retried with
backoff; the node plugin keeps serving meanwhile.

Without an API server (the kubelet simulator's claims folder), the slices are written
as documents into that folder instead, where the simulator reads them as the
scheduler would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.api.dra.constants import RESOURCE_SLICES_PATH as SLICES
from devplug.apiserver import failures
from devplug.apiserver.backoff import Backoff
from devplug.framework import observe
from devplug.framework.dra.driver import DriverBinding
from devplug.framework.dra.slices import MANAGED_BY, slice_bodies

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

log = logging.getLogger("devplug.dra.publisher")

_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0
# The annotation naming the devplug instance that wrote a slice: '<start ns>-<id>',
# so that the later started of two instances (a rolling update) is the greater.
PUBLISHER_ANNOTATION = "devplug.io/publisher"
_KEEP_VERSIONS = 8  # resource versions of our own writes remembered per slice


def publisher_stamp(instance: str, started_ns: int | None = None) -> str:
    started = time.time_ns() if started_ns is None else started_ns
    return f"{started:020d}-{instance}"


def _content(obj: Mapping[str, Any]) -> Any:
    """What of a slice the publisher owns (compared in the API server's own form)."""
    meta = obj.get("metadata") or {}
    return (
        obj.get("spec"),
        (meta.get("labels") or {}).get(MANAGED_BY[0]),
        (meta.get("annotations") or {}).get(PUBLISHER_ANNOTATION),
        meta.get("ownerReferences"),
    )


def _stamp_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(PUBLISHER_ANNOTATION, ""))


def _generation_of(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


class PoolPublisher:
    """Publishes the node's pool of one driver on every change of its devices."""

    def __init__(self, driver: DriverBinding, node: str) -> None:
        self.driver = driver
        self.node = node
        self.published_generation = 0  # the plugin generation last published
        self.pool_generation = 0
        self._published = asyncio.Event()

    def problems(self) -> list[str]:
        """Why the node's slices are not what the devices say now (for /readyz)."""
        if self.published_generation < self.driver.plugin.generation:
            return [f"{self.driver.name}: ResourceSlices of node {self.node} not published yet"]
        return []

    async def wait_published(self, plugin_generation: int) -> None:
        """Wait until the devices of `plugin_generation` (or newer) are published."""
        while self.published_generation < plugin_generation:
            event = self._published
            await event.wait()

    async def run(self) -> None:
        """Publish the devices, and again after every change, until cancelled."""
        raise NotImplementedError

    def _count_failure(self, error: BaseException) -> str:
        """Publishing failed, as the metrics and the events count it (a failure to list
        and watch the slices too: the informer says why and retries); the failure in
        one line. (devplug's client is imported here: a folder publisher needs none.)"""
        from devplug.apiserver.client import explain

        said = explain(error)
        observe.emit(
            observe.SLICES_PUBLISHED,
            self.driver.name,
            f"publishing slices failed: {said}",
            logging.DEBUG,
            result="error",
        )
        return said

    async def _failed(self, error: BaseException, backoff: Backoff) -> None:
        """Say that publishing failed and wait: the backoff's next wait, or its longest
        for a permanent failure (not trusted, not allowed), said as an error."""
        permanent = failures.kind(error) == failures.PERMANENT
        retry = backoff.most if permanent else backoff.next()
        said = self._count_failure(error)
        log.log(
            logging.ERROR if permanent else logging.WARNING,
            "%s: publishing slices failed (%s); retrying in %.1f s",
            self.driver.name,
            said,
            retry,
        )
        await asyncio.sleep(retry)

    def _log_published(self, generation: int) -> None:
        healthy = sum(o.device.healthy for o in self.driver.offers().values())
        observe.emit(
            observe.SLICES_PUBLISHED,
            self.driver.name,
            f"slices published (pool generation {generation})",
            logging.DEBUG,
            result="ok",
        )
        log.info(
            "%s: published %d device(s) for node %s (pool generation %d)",
            self.driver.name,
            healthy,
            self.node,
            generation,
        )

    def _done(self, plugin_generation: int) -> None:
        """The devices of `plugin_generation` are published: wake who waits for them."""
        self.published_generation = plugin_generation
        published, self._published = self._published, asyncio.Event()
        published.set()


class FolderSlicePublisher(PoolPublisher):
    """The slices as JSON documents in a folder ('<slice name>.json'): the simulator's
    stand-in for the API server, beside the claim documents."""

    def __init__(self, driver: DriverBinding, node: str, folder: Path) -> None:
        super().__init__(driver, node)
        self.folder = folder
        self._written: set[str] = set()

    def _sync(self) -> int:
        """Write the current devices as the next pool generation; returns it."""
        from devplug.ground.files import remove_quietly, write_atomic

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

    async def run(self) -> None:
        plugin = self.driver.plugin
        await plugin.wait_published()
        backoff = Backoff(_RETRY_FIRST_S, _RETRY_MAX_S)
        while True:
            seen = plugin.generation
            try:
                generation = await asyncio.to_thread(self._sync)
            except OSError as error:  # a full disk, a folder gone: a later attempt may do
                await self._failed(error, backoff)
                continue
            backoff.reset()
            self._log_published(generation)
            self._done(seen)
            await plugin.wait_changed(seen)


class SlicePublisher(PoolPublisher):
    """The slices on the API server, owned by the Node object, kept so by a watch (the
    one informer, on the daemon's session to the API server, entered by its owner)."""

    def __init__(self, driver: DriverBinding, node: str, api: KubeApi, stamp: str = "") -> None:
        from devplug.apiserver.informer import Informer

        super().__init__(driver, node)
        self.stamp = stamp or publisher_stamp("devplug")
        self._api = api
        # The API server's slices of our pool, by name: the informer's view.
        self._watch = Informer(
            api,
            SLICES,
            params={"fieldSelector": f"spec.nodeName={node},spec.driver={driver.name}"},
            what=f"{driver.name}: publishing slices failed",
            on_list=lambda items: self._changed.set(),
            on_event=lambda kind, obj: self._changed.set(),
            on_failure=self._count_failure,
        )
        self._owner: dict[str, Any] | None = None
        self._owner_known = False
        self._changed = asyncio.Event()
        self._wanted: dict[str, dict[str, Any]] = {}  # the bodies of the current generation
        self._wanted_devices: Any = None  # the wanted content without the generation
        self._wanted_for: int | None = None  # the plugin generation `_wanted` was built for
        self._current: dict[str, str] = {}  # name -> resource version of our current write
        self._written: dict[str, Any] = {}  # name -> what of it we wrote (server form)
        self._ours: dict[str, list[str]] = {}  # name -> resource versions we wrote
        self._in_sync = False
        self._yielded: set[str] = set()  # slices left to a newer instance (logged once)
        self._foreign: set[str] = set()  # slices of our pool devplug did not make

    @property
    def _listed(self) -> bool:
        return self._watch.synced.is_set()

    @property
    def _view(self) -> dict[str, dict[str, Any]]:
        return self._watch.objects

    def problems(self) -> list[str]:
        """Why the node's slices are not what the devices say now (for /readyz)."""
        name = self.driver.name
        if not self._listed:
            return [f"{name}: ResourceSlices not listed from the API server yet"]
        if not self._in_sync or self.published_generation < self.driver.plugin.generation:
            return [f"{name}: ResourceSlices of node {self.node} not published yet"]
        return []

    # -- what we want -------------------------------------------------------------------

    async def _node_owner(self) -> None:
        """Read the Node once, as the owner of the slices, so that they go with their
        node; no owner if the API server refuses it (a connection failure is raised, and
        the next attempt asks again)."""
        from devplug.apiserver.client import ApiError

        try:
            node = await self._api.call("GET", f"/api/v1/nodes/{self.node}")
        except ApiError as error:
            log.warning(
                "%s: cannot read node %s (%s): slices get no owner",
                self.driver.name,
                self.node,
                failures.say(error),
            )
        else:
            self._owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": node["metadata"]["uid"],
            }
        self._owner_known = True

    def _want(self, plugin_generation: int) -> None:
        """The bodies for the current devices: a new pool generation when what they
        publish changed. Built once per change of the devices, not for every watch event
        (each write of ours comes back as one)."""
        if plugin_generation == self._wanted_for:
            return
        self._wanted_for = plugin_generation
        bodies = slice_bodies(self.driver, self.node, 0, self._owner)
        devices = [[b["metadata"], b["spec"]] for b in bodies]
        if devices == self._wanted_devices:
            return
        self._wanted_devices = json.loads(json.dumps(devices))
        self.pool_generation = 1 + max(
            [self.pool_generation, *(_generation_of(o) for o in self._view.values())]
        )
        self._wanted = {}
        for body in bodies:
            body["spec"]["pool"]["generation"] = self.pool_generation
            body["metadata"].setdefault("annotations", {})[PUBLISHER_ANNOTATION] = self.stamp
            self._wanted[body["metadata"]["name"]] = body
        self._current.clear()

    # -- reconciling ---------------------------------------------------------------------

    def _plan(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(action, name, body) to make the API server's slices what we want."""
        actions: list[tuple[str, str, dict[str, Any] | None]] = []
        for name, body in self._wanted.items():
            obj = self._view.get(name)
            if obj is None:
                actions.append(("create", name, body))
                continue
            version = str(obj["metadata"]["resourceVersion"])
            if _stamp_of(obj) > self.stamp:
                self._say_once(self._yielded, name, "is published by a newer devplug instance")
                continue
            self._yielded.discard(name)
            if name in self._current and version in self._ours.get(name, ()):
                continue  # ours (maybe an older event of ours: a newer one will come)
            if name in self._current and _content(obj) == self._written.get(name):
                continue  # someone touched only what is not ours (other labels...)
            actions.append(("replace", name, body))
        for name, obj in self._view.items():
            if name in self._wanted:
                continue
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
                why = f"of node {self.node} was not made by devplug"
                self._say_once(self._foreign, name, why, logging.WARNING)
                continue
            if _stamp_of(obj) > self.stamp:
                continue  # a newer instance's layout
            actions.append(("delete", name, obj))
        return actions

    def _say_once(self, said: set[str], name: str, what: str, level: int = logging.INFO) -> None:
        """Log once per slice that it is left alone, and why."""
        if name not in said:
            said.add(name)
            log.log(level, "%s: slice %s %s: left alone", self.driver.name, name, what)

    async def _apply(self, actions: list[tuple[str, str, dict[str, Any] | None]]) -> None:
        """Run the actions; a conflict means the view is behind: the watch brings the
        news and the next plan acts on it."""
        from devplug.apiserver.client import ApiError

        for action, name, body in actions:
            assert body is not None
            try:
                if action == "create":
                    written = await self._api.call("POST", SLICES, body)
                elif action == "replace":
                    old = self._view.get(name)
                    if old is None:  # deleted meanwhile: the next plan creates it
                        continue
                    body = json.loads(json.dumps(body))
                    body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                    written = await self._api.call("PUT", f"{SLICES}/{name}", body)
                else:
                    version = body["metadata"]["resourceVersion"]
                    precondition = {"preconditions": {"resourceVersion": version}}
                    await self._api.call("DELETE", f"{SLICES}/{name}", precondition)
                    continue
            except ApiError as error:
                if error.status in (404, 409):
                    continue
                raise
            version = str(written["metadata"]["resourceVersion"])
            self._ours.setdefault(name, []).append(version)
            del self._ours[name][:-_KEEP_VERSIONS]
            self._current[name] = version
            self._written[name] = _content(written)

    async def run(self) -> None:
        from devplug.apiserver.client import FAILURES

        plugin = self.driver.plugin
        await plugin.wait_published()
        self._watch.start()
        backoff = Backoff(_RETRY_FIRST_S, _RETRY_MAX_S)
        try:
            while True:
                if not self._listed:
                    await self._wait_for_change(plugin.generation)
                    continue
                seen = plugin.generation
                try:
                    if not self._owner_known:
                        await self._node_owner()
                    self._want(seen)
                    actions = self._plan()
                    if actions:
                        self._in_sync = False
                        self._log_actions(actions)
                        await self._apply(actions)
                        await self._wait_for_change(seen)
                        continue
                except (*FAILURES, ValueError) as error:  # ValueError: an answer not JSON
                    self._in_sync = False
                    await self._failed(error, backoff)
                    continue
                backoff.reset()
                if not self._in_sync or self.published_generation < seen:
                    self._log_published(self.pool_generation)
                self._in_sync = True
                if self.published_generation < seen:
                    self._done(seen)
                await self._wait_for_change(seen)
        finally:
            await self._watch.stop()

    def _log_actions(self, actions: list[tuple[str, str, dict[str, Any] | None]]) -> None:
        for action, name, _ in actions:
            if action == "delete" or name not in self._current:
                continue  # publishing a new generation, or tidying: said once it is done
            cause = "deleted" if action == "create" else "changed"
            log.warning(
                "%s: slice %s was %s by someone else: restoring it", self.driver.name, name, cause
            )

    async def _wait_for_change(self, generation: int) -> None:
        """Until the API server's view or the devices change."""
        if self._changed.is_set():
            self._changed.clear()
            return
        plugin = self.driver.plugin
        changed = asyncio.ensure_future(self._changed.wait())
        devices = asyncio.ensure_future(plugin.wait_changed(generation))
        try:
            await asyncio.wait({changed, devices}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            devices.cancel()
        self._changed.clear()
