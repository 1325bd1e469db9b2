"""The publisher watches its slices: one deleted (as the kubelet's start-up wipe does)
or edited by someone else comes back as it was, without a restart; a slice of the same
pool that devplug did not make is left alone; /readyz says ready once the slices are
published.

One node serves the whole file (module-scoped fixtures, in story order); each test
checks one behaviour of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from tests.dra_cluster_helpers import node_serving, our_slice, slice_where
from tests.dra_helpers import DRIVER, NODE, NodeDirs, accelerator_config
from tests.serve_helpers import free_port, http_get, wait_for_log

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass(frozen=True)
class Serving:
    port: int  # of the metrics server
    log: Any  # the daemon's log file


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, api: Any, node: str, module_dirs: NodeDirs
) -> AsyncIterator[Serving]:
    config = accelerator_config(module_dirs, {"acc0": "u250", "acc1": "u280"})
    port = free_port()
    metrics = ("--metrics-port", str(port))
    async with node_serving(module_dirs, api, kubeconfig, config, DRIVER, None, *metrics):
        yield Serving(port, module_dirs.root / "daemon.log")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def first(serving: Serving, api: Any) -> dict[str, Any]:
    """The slice as first published."""
    return await slice_where(api, our_slice(lambda d: {"acc0", "acc1"} == set(d)))


def renewed(name: str, before: dict[str, Any]) -> Any:
    """The slice `name` made anew (another uid than `before`'s)."""
    return lambda o: (
        o["metadata"]["name"] == name and o["metadata"]["uid"] != before["metadata"]["uid"]
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def back(first: dict[str, Any], api: Any) -> dict[str, Any]:
    """The slice once deleted by someone else, back."""
    from kubernetes import client

    name = first["metadata"]["name"]
    client.ResourceV1Api(api).delete_resource_slice(name)
    return await slice_where(api, renewed(name, first))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fixed(back: dict[str, Any], api: Any) -> dict[str, Any]:
    """The slice once someone else removed a device from it, put back."""
    from kubernetes import client

    edited = json.loads(json.dumps(back))
    edited["spec"]["devices"] = edited["spec"]["devices"][:1]
    client.ResourceV1Api(api).replace_resource_slice(back["metadata"]["name"], edited)
    return await slice_where(api, our_slice(lambda d: {"acc0", "acc1"} == set(d)))


async def test_the_slice_names_its_publisher(first: dict[str, Any]) -> None:
    assert first["metadata"]["annotations"]["devplug.io/publisher"]


async def test_readyz_says_ready_once_the_slices_are_published(
    first: dict[str, Any], serving: Serving
) -> None:
    """Ready once the publisher has seen its own slices in the API server."""
    await asyncio.to_thread(wait_for_log, serving.log, "published 2 device")
    status, body = await asyncio.to_thread(http_get, serving.port, "/readyz")
    assert (status, body) == (200, "ok\n")


async def test_a_slice_deleted_by_someone_else_comes_back_as_it_was(
    back: dict[str, Any], first: dict[str, Any], serving: Serving
) -> None:
    assert back["spec"] == first["spec"]
    name = first["metadata"]["name"]
    log = await asyncio.to_thread(
        wait_for_log, serving.log, f"slice {name} was deleted by someone else: restoring it"
    )
    assert f"slice {name} was deleted by someone else: restoring it" in log


async def test_a_slice_changed_by_someone_else_is_put_back_in_the_same_generation(
    fixed: dict[str, Any], first: dict[str, Any], serving: Serving
) -> None:
    assert fixed["spec"]["pool"]["generation"] == first["spec"]["pool"]["generation"]
    name = first["metadata"]["name"]
    log = await asyncio.to_thread(
        wait_for_log, serving.log, f"slice {name} was changed by someone else: restoring it"
    )
    assert f"slice {name} was changed by someone else: restoring it" in log


@pytest.fixture
def foreign(api: Any) -> Iterator[str]:
    """A slice of the same driver and node that devplug did not make."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "not-devplugs"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": "other", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "x"}],
        },
    }
    resource.create_resource_slice(body)
    yield body["metadata"]["name"]
    resource.delete_resource_slice(body["metadata"]["name"])


async def test_someone_elses_slice_of_the_same_driver_and_node_is_left_alone(
    foreign: str, fixed: dict[str, Any], back: dict[str, Any], serving: Serving, api: Any
) -> None:
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    name = fixed["metadata"]["name"]
    # Deleting ours once more: the restore that follows is seen after the foreign slice
    # was, so the publisher has had it in view.
    resource.delete_resource_slice(name)
    await slice_where(api, renewed(name, back))
    answer = resource.list_resource_slice(
        field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}", _preload_content=False
    )
    assert {s["metadata"]["name"] for s in json.loads(answer.data)["items"]} == {name, foreign}
    log = await asyncio.to_thread(
        wait_for_log, serving.log, f"slice {foreign} of node node-a was not made by devplug"
    )
    assert "slice not-devplugs of node node-a was not made by devplug: left alone" in log
