"""The one list-and-watch informer against a real API server (the throwaway control
plane): a list that syncs, changes followed by the watch; a watch the server ends
resumed from the last version seen and one refused as too old (410) listed again,
losing nothing; an API server that cannot be reached retried with backoff, said in one
line; and a stop that ends it at once."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from devplug.apiserver.client import KubeApi
from devplug.apiserver.informer import Informer
from devplug.apiserver.kubeconfig import Target, load

WAIT_S = 30.0


class Hooked(KubeApi):
    """The real API with a step run before each watch is opened (a change made while no
    watch is open), which may refuse the watch as the API server refuses one whose
    version its history no longer holds: a 410 Status event (the server's watch cache
    here holds its whole history, so it never does by itself)."""

    before: Callable[[int, str], Awaitable[bool]] | None = None
    opened = 0

    async def watch(
        self, path: str, params: Mapping[str, str], timeout: float
    ) -> AsyncIterator[bytes]:
        self.opened += 1
        version = params["resourceVersion"]
        if self.before is not None and not await self.before(self.opened, version):
            gone = {"kind": "Status", "code": 410, "reason": "Expired"}
            message = f"too old resource version: {version}"
            yield json.dumps({"type": "ERROR", "object": gone | {"message": message}}).encode()
            return
        async for line in super().watch(path, params, timeout):
            yield line


@pytest.fixture
async def namespace(kubeconfig: str) -> AsyncIterator[tuple[Hooked, str]]:
    async with Hooked(load(kubeconfig)) as api:
        name = f"informer-{uuid.uuid4().hex[:6]}"
        await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        try:
            yield api, name
        finally:
            await api.call("DELETE", f"/api/v1/namespaces/{name}")


async def make(api: KubeApi, namespace: str, name: str, value: str = "1") -> None:
    body = {"metadata": {"name": name}, "data": {"v": value}}
    await api.call("POST", f"/api/v1/namespaces/{namespace}/configmaps", body)


async def until(informer: Informer, wanted: Callable[[dict[str, Any]], bool]) -> None:
    """Until the informer's view is as wanted (checked at each change it sees)."""
    changed = asyncio.Event()
    on_event = informer.on_event

    def seen(kind: str, obj: dict[str, Any]) -> None:
        if on_event is not None:
            on_event(kind, obj)
        changed.set()

    informer.on_event = seen
    informer.on_list = lambda _: changed.set()
    async with asyncio.timeout(WAIT_S):
        while not wanted(informer.objects):
            changed.clear()
            await changed.wait()


def values(objects: dict[str, Any]) -> dict[str, str]:
    return {name: obj["data"]["v"] for name, obj in objects.items()}


async def test_it_lists_once_then_follows_each_change_by_the_watch(
    namespace: tuple[Hooked, str],
) -> None:
    api, ns = namespace
    await make(api, ns, "first")
    path = f"/api/v1/namespaces/{ns}/configmaps"
    seen: list[tuple[str, str]] = []
    informer = Informer(
        api,
        path,
        params={"labelSelector": "!skipped"},
        on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    informer.start()
    try:
        async with asyncio.timeout(WAIT_S):
            await informer.synced.wait()
        assert values(informer.objects) == {f"{ns}/first": "1"}
        await make(api, ns, "second", "2")
        patch = {"data": {"v": "3"}}
        await api.call("PATCH", f"{path}/first", patch, content_type="application/merge-patch+json")
        await api.call("DELETE", f"{path}/second")
        hidden = {"metadata": {"name": "hidden", "labels": {"skipped": "yes"}}}
        await api.call("POST", path, hidden)
        await until(informer, lambda objects: values(objects) == {f"{ns}/first": "3"})
        assert seen == [("ADDED", "second"), ("MODIFIED", "first"), ("DELETED", "second")]
        assert (informer.lists, informer.watches) == (1, 1)
    finally:
        await informer.stop()


async def test_a_watch_that_ends_resumes_and_one_too_old_lists_again_losing_nothing(
    namespace: tuple[Hooked, str],
) -> None:
    api, ns = namespace

    async def before(watch: int, version: str) -> bool:
        """Each watch after the first: an object made while no watch is open; the third
        refused as too old."""
        if watch == 2:
            await make(api, ns, "gap")
        if watch == 3:
            await make(api, ns, "gone")
            return False
        return True

    api.before = before
    informer = Informer(api, f"/api/v1/namespaces/{ns}/configmaps", watch_timeout_s=1)
    informer.start()
    try:
        # The first watch ended after 1 s, the second resumed from its version: the
        # object made between them is seen without a list.
        await until(informer, lambda objects: f"{ns}/gap" in objects)
        assert informer.lists == 1
        # The third was refused as too old: listed again, the object made before it seen.
        await until(informer, lambda objects: f"{ns}/gone" in objects)
        assert informer.lists == 2
        assert set(informer.objects) == {f"{ns}/gap", f"{ns}/gone"}
    finally:
        await informer.stop()


async def test_an_api_server_away_is_retried_with_backoff_and_said_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    target = Target(f"http://127.0.0.1:{port}", "a closed port")
    failed: list[Exception] = []
    twice = asyncio.Event()

    def on_failure(error: Exception) -> None:
        failed.append(error)
        if len(failed) == 2:
            twice.set()

    caplog.set_level(logging.WARNING, "devplug.apiserver.informer")
    async with KubeApi(target) as api:
        informer = Informer(api, "/api/v1/nodes", what="nodes", on_failure=on_failure)
        informer.start()
        async with asyncio.timeout(WAIT_S):
            await twice.wait()
        async with asyncio.timeout(5):
            await informer.stop()
    assert not informer.synced.is_set()
    assert informer.lists == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith(
        f"nodes: cannot list and watch them (GET http://127.0.0.1:{port}/api/v1/nodes: "
        "the API server cannot be reached (connection refused)); the last state is kept, "
        "retrying in "
    ), lines
    assert all("\n" not in line and "Traceback" not in line for line in lines)
