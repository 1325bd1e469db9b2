"""ResourceSlice bodies for one node's pool of a driver: the devices as the scheduler
sees them, attributes typed, capacities as quantities; the counter sets of
partitioned devices in slices of their own (the API allows a slice to hold devices or
counter sets, not both).

Pure functions over the published devices, so `devplug check` shows exactly what the
daemon publishes. An unhealthy device stays in the slice with a taint
(`devplug.io/unhealthy`): the scheduler allocates it only to claims that tolerate the
taint, and the taint goes when the device recovers.
"""

from __future__ import annotations

import logging
from typing import Any

from devplug.api.dra.constants import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_ADVANCED,
    MAX_TAINTS_PER_DEVICE,
    RESOURCE_API_VERSION,
    SKIP_ALL_NODE_OPERATIONS,
)
from devplug.framework.device import Attribute
from devplug.framework.dra.driver import DriverBinding, Offer
from devplug.framework.dra.layout import consumption, counter_set, shared_capacity
from devplug.kube.dranames import attribute_problem, object_name

log = logging.getLogger("devplug.dra.slices")

# The label on every slice devplug publishes: only such slices are ever deleted by it.
MANAGED_BY = ("app.kubernetes.io/managed-by", "devplug")

# Problems already logged, so that a bad attribute is reported once, not per publish.
_reported: set[str] = set()


def _report(problem: str) -> None:
    if problem not in _reported:
        _reported.add(problem)
        log.warning("%s", problem)


def typed_value(value: Attribute) -> dict[str, Any]:
    """{'string': 'u280'}, {'int': 0} or {'bool': True}: a DeviceAttribute."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def slice_device(driver: DriverBinding, offer: Offer) -> dict[str, Any]:
    """One device of a ResourceSlice (v1 `Device`): a partition consumes its parent's
    counters; a shared device allows several allocations of its capacities."""
    device = offer.device
    attributes, capacity = driver.describe(device)
    body: dict[str, Any] = {"name": offer.name}
    typed: dict[str, Any] = {}
    for name, value in attributes.items():
        if problem := attribute_problem(name, value):
            _report(f"{driver.name}: device {device.id}: {problem}: not published")
            continue
        typed[name] = typed_value(value)
    quantities: dict[str, dict[str, Any]] = {
        name: {"value": str(value)} for name, value in capacity.items()
    }
    if offer.layout is not None and offer.shared:
        quantities.update(shared_capacity(offer.layout, capacity))
    if len(typed) + len(quantities) > MAX_ATTRIBUTES_AND_CAPACITIES:
        _report(
            f"{driver.name}: device {device.id}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} "
            "attributes and capacities: the last ones are not published"
        )
        keep = MAX_ATTRIBUTES_AND_CAPACITIES - len(quantities)
        typed = dict(list(typed.items())[: max(keep, 0)])
    if typed:
        body["attributes"] = typed
    if quantities:
        body["capacity"] = quantities
    if taints := driver.taints(device):
        if len(taints) > MAX_TAINTS_PER_DEVICE:
            _report(
                f"{driver.name}: device {device.id}: more than {MAX_TAINTS_PER_DEVICE} taints: "
                "the last ones are not published"
            )
        body["taints"] = taints[:MAX_TAINTS_PER_DEVICE]
    if offer.partition is not None:
        body["consumesCounters"] = consumption(offer.counter_set, offer.partition)
    if offer.shared:
        body["allowMultipleAllocations"] = True
    return body


def slice_name(node: str, driver: str, index: int) -> str:
    return object_name(node, driver, str(index))


def counter_slice_name(node: str, driver: str, index: int) -> str:
    return object_name(node, driver, "counters", str(index))


def _devices_per_slice(devices: list[dict[str, Any]]) -> int:
    """The API allows 128 devices in a slice, 64 when one consumes counters or has
    taints."""
    advanced = any("consumesCounters" in d or "taints" in d for d in devices)
    return MAX_DEVICES_PER_SLICE_ADVANCED if advanced else MAX_DEVICES_PER_SLICE


def slice_bodies(
    driver: DriverBinding, node: str, generation: int, owner: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The ResourceSlices of the node's pool, all with pool `generation`: the counter
    sets of the partitioned devices (8 per slice), then the devices and partitions
    (128 per slice, 64 with partitions or taints: an unhealthy one is tainted), one
    slice (maybe empty) at least."""
    offers = list(driver.offers().values())
    devices = [slice_device(driver, o) for o in offers]
    parents = {o.counter_set: o.layout for o in offers if o.partition is not None}
    sets = [counter_set(name, layout.counters) for name, layout in parents.items() if layout]
    per_slice = _devices_per_slice(devices)
    device_chunks = [devices[i : i + per_slice] for i in range(0, len(devices), per_slice)] or [[]]
    set_chunks = [
        sets[i : i + MAX_COUNTER_SETS_PER_SLICE]
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    count = len(set_chunks) + len(device_chunks)
    named: list[tuple[str, dict[str, Any]]] = [
        (counter_slice_name(node, driver.name, i), {"sharedCounters": chunk})
        for i, chunk in enumerate(set_chunks)
    ]
    # All the operations, as no device of such a driver needs either (Kubernetes 1.37,
    # alpha: an API server without the feature drops the field, and its kubelet calls).
    skip = {"skipNodeOperations": [SKIP_ALL_NODE_OPERATIONS]} if driver.skip_node_operations else {}
    named += [
        (slice_name(node, driver.name, i), {"devices": chunk, **skip})
        for i, chunk in enumerate(device_chunks)
    ]
    bodies = []
    for name, content in named:
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
        }
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        bodies.append(
            {
                "apiVersion": RESOURCE_API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver.name,
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                    **content,
                },
            }
        )
    return bodies
