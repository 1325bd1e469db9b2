"""Partitions of a card allocated by the real scheduler from what the daemon publishes
(the half-a-card example of docs/dra.md): the halves it allocates never share a slot,
what does not fit waits, the node prepares each with the card's device node, and a
half that goes frees its slots for what waits.

One node serves the whole file (module-scoped fixtures, in story order); each test
checks one behaviour of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from devplug.simulator import Kubelet
from tests.dra_cluster_helpers import (
    WAIT_S,
    allocation,
    claim_from,
    device_class_made,
    doc_config,
    doc_objects,
    node_serving,
    pending,
    pod_from,
    published_by,
    release,
    resources,
    scheduled_message,
    variant,
)
from tests.dra_helpers import NODE, NodeDirs

pytestmark = pytest.mark.asyncio(loop_scope="module")

DRIVER = "region.devplug.io"
HALVES = ("half-0", "half-1", "half-2")  # pods of the claims h0, h1, h2


def slots(results: list[dict[str, Any]]) -> set[int]:
    """The slots of the partition in a claim's allocation `results` (none if it waits)."""
    if not results:
        return set()
    [result] = results
    span = result["device"].removeprefix("fpga0-").split("-")[1:]
    return set(range(int(span[0]), int(span[-1]) + 1))


def running(kubelet: Kubelet, namespace: str, *names: str) -> list[str]:
    """Those of the pods `names` the node admitted."""
    pods = [(n, kubelet.pod(n, namespace)) for n in names]
    return [n for n, p in pods if p is not None and p.admitted]


@pytest.fixture(scope="module")
def objects(api: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The doc's claim template and pod; its device class made meanwhile."""
    device_class, template, pod = doc_objects(DRIVER, "half-fpga", "half-synth")
    with device_class_made(api, device_class):
        yield template, pod


@pytest.fixture(scope="module")
def card(module_dirs: NodeDirs) -> Path:
    return module_dirs.make_device("fpga0")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, api: Any, node: str, module_dirs: NodeDirs, card: Path
) -> AsyncIterator[Kubelet]:
    """The node serving the doc's config for the card, its counters published."""
    import yaml

    config = doc_config("region")
    config["resources"][0]["groups"][0]["paths"] = [{"path": str(card)}]
    path = module_dirs.root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    async with node_serving(module_dirs, api, kubeconfig, path, DRIVER) as kubelet:
        await published_by(api, DRIVER, lambda spec: "sharedCounters" in spec)
        yield kubelet


@dataclass(frozen=True)
class Halves:
    first: str  # the claims of the two pods that run
    second: str
    waiting: str  # the pod that waits
    results: dict[str, list[dict[str, Any]]]  # the allocation of each claim


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def halves(
    serving: Kubelet,
    objects: tuple[dict[str, Any], dict[str, Any]],
    api: Any,
    module_namespace: str,
) -> Halves:
    """Three half-a-card claims and their pods, until two run and the third waits."""
    from kubernetes import client

    template, pod = objects
    ns = module_namespace
    for i, name in enumerate(HALVES):
        resources(api).create_namespaced_resource_claim(ns, claim_from(template, f"h{i}"))
        client.CoreV1Api(api).create_namespaced_pod(ns, pod_from(pod, name, f"h{i}"))
    await serving.wait_for(lambda: len(running(serving, ns, *HALVES)) == 2, WAIT_S, "two halves")
    [waiting] = set(HALVES) - set(running(serving, ns, *HALVES))
    await pending(api, waiting, ns)
    first, second = (f"h{n[-1]}" for n in running(serving, ns, *HALVES))
    results = {f"h{i}": allocation(resources(api), f"h{i}", ns) for i in range(len(HALVES))}
    return Halves(first, second, waiting, results)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def one_slot_refused(
    halves: Halves, objects: tuple[dict[str, Any], dict[str, Any]], api: Any, module_namespace: str
) -> dict[str, Any]:
    """A one-slot claim's pod, once the scheduler gave up on it."""
    from kubernetes import client

    template, pod = objects
    one_slot = variant(template, f'device.attributes["{DRIVER}"].slots == 1')
    resources(api).create_namespaced_resource_claim(module_namespace, claim_from(one_slot, "s0"))
    client.CoreV1Api(api).create_namespaced_pod(module_namespace, pod_from(pod, "slot", "s0"))
    return await pending(api, "slot", module_namespace)


@dataclass(frozen=True)
class Prepared:
    uid: str  # of the claim
    device: str  # the partition allocated to it
    spec: dict[str, Any]  # its CDI spec


@pytest.fixture(scope="module")
def prepared(
    halves: Halves, api: Any, module_namespace: str, module_dirs: NodeDirs
) -> dict[str, Prepared]:
    """The CDI spec of each running half, by claim."""
    found = {}
    for claim in (halves.first, halves.second):
        uid = resources(api).read_namespaced_resource_claim(claim, module_namespace).metadata.uid
        [result] = halves.results[claim]
        spec = json.loads((module_dirs.cdi / f"{DRIVER}-{uid}.json").read_text())
        found[claim] = Prepared(uid, result["device"], spec)
    return found


@dataclass(frozen=True)
class HalfGone:
    freed: set[int]  # the slots of the half that went
    kept: set[int]  # the slots of the half that stays
    results: list[list[dict[str, Any]]]  # the allocation of every other claim, then

    @property
    def taken(self) -> list[set[int]]:
        return [slots(r) for r in self.results]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def half_gone(
    serving: Kubelet,
    halves: Halves,
    one_slot_refused: dict[str, Any],
    prepared: dict[str, Prepared],
    api: Any,
    module_namespace: str,
) -> HalfGone:
    """A half goes (its claim released, as the controller-manager would), until a
    waiting pod runs."""
    from kubernetes import client

    ns = module_namespace
    gone = f"half-{halves.first[-1]}"
    client.CoreV1Api(api).delete_namespaced_pod(gone, ns, grace_period_seconds=0)
    await serving.wait_for(lambda: serving.pod(gone, ns) is None, WAIT_S, f"{gone} deleted")
    freed = slots(allocation(resources(api), halves.first, ns))
    kept = slots(allocation(resources(api), halves.second, ns))
    release(resources(api), halves.first, ns)
    await serving.wait_for(
        lambda: bool(running(serving, ns, halves.waiting, "slot")),
        WAIT_S,
        "a waiting pod scheduled",
    )
    others = [f"h{i}" for i in range(len(HALVES)) if f"h{i}" != halves.first] + ["s0"]
    return HalfGone(freed, kept, [allocation(resources(api), c, ns) for c in others])


def pools(allocations: list[list[dict[str, Any]]]) -> set[tuple[str, str]]:
    return {(r["driver"], r["pool"]) for results in allocations for r in results}


async def test_every_partition_is_allocated_from_the_nodes_pool(halves: Halves) -> None:
    assert pools(list(halves.results.values())) == {(DRIVER, NODE)}


async def test_two_halves_are_allocated_that_never_share_a_slot(halves: Halves) -> None:
    first, second = (slots(halves.results[c]) for c in (halves.first, halves.second))
    assert first | second == {0, 1, 2, 3}
    assert not first & second


async def test_a_third_half_waits_unallocated(halves: Halves) -> None:
    assert not slots(halves.results[f"h{halves.waiting[-1]}"])


async def test_a_one_slot_claim_waits_while_every_slot_is_taken(
    one_slot_refused: dict[str, Any],
) -> None:
    assert "cannot allocate all claims" in scheduled_message(one_slot_refused)


async def test_each_half_is_prepared_with_the_cards_device_node(
    prepared: dict[str, Prepared], card: Path
) -> None:
    for half in prepared.values():
        [cdi] = half.spec["devices"]
        assert cdi["name"] == f"{half.uid}-{half.device}"
        assert [n["hostPath"] for n in cdi["containerEdits"]["deviceNodes"]] == [str(card)]


async def test_each_half_is_told_its_partition_in_the_environment(
    prepared: dict[str, Prepared],
) -> None:
    for half in prepared.values():
        env = f"DEVPLUG_EXAMPLE_COM_FPGA_REGION={half.device}"
        assert env in half.spec["containerEdits"]["env"]


async def test_what_waits_is_allocated_in_the_slots_a_gone_half_freed(
    half_gone: HalfGone,
) -> None:
    new = set().union(*half_gone.taken) - half_gone.kept
    assert new
    assert new <= half_gone.freed


async def test_what_waits_is_allocated_from_the_nodes_pool_too(half_gone: HalfGone) -> None:
    assert pools(half_gone.results) == {(DRIVER, NODE)}


async def test_partitions_still_never_overlap_once_a_half_went(half_gone: HalfGone) -> None:
    taken = half_gone.taken
    assert sum(map(len, taken)) == len(set().union(*taken)) <= 4
