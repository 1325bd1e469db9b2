"""ResourceSlice bodies for one node's pool of a driver: the devices as the scheduler
sees them, attributes typed, capacities as quantities.

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
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_ADVANCED,
    MAX_STRING_ATTRIBUTE_LENGTH,
    MAX_TAINTS_PER_DEVICE,
    RESOURCE_API_VERSION,
)
from devplug.framework.device import Attribute, Device
from devplug.framework.dra.driver import Driver
from devplug.framework.dra.names import attribute_name_problem, device_name, object_name

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


def attribute_problem(name: str, value: Attribute) -> str | None:
    if problem := attribute_name_problem(name):
        return problem
    if isinstance(value, str) and len(value) > MAX_STRING_ATTRIBUTE_LENGTH:
        return f"attribute {name!r}: value longer than {MAX_STRING_ATTRIBUTE_LENGTH} characters"
    return None


def slice_device(driver: Driver, device: Device) -> dict[str, Any]:
    """One device of a ResourceSlice (v1 `Device`)."""
    attributes, capacity = driver.describe(device)
    body: dict[str, Any] = {"name": device_name(device.id)}
    typed: dict[str, Any] = {}
    for name, value in attributes.items():
        if problem := attribute_problem(name, value):
            _report(f"{driver.name}: device {device.id}: {problem}: not published")
            continue
        typed[name] = typed_value(value)
    quantities = {name: {"value": str(value)} for name, value in capacity.items()}
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
    return body


def devices_per_slice(devices: list[dict[str, Any]]) -> int:
    """How many of `devices` a slice may hold: 64 when one of them has taints or
    consumes counters, 128 otherwise (the API's limits)."""
    advanced = any("taints" in d or "consumesCounters" in d for d in devices)
    return MAX_DEVICES_PER_SLICE_ADVANCED if advanced else MAX_DEVICES_PER_SLICE


def slice_name(node: str, driver: str, index: int) -> str:
    return object_name(node, driver, str(index))


def slice_bodies(
    driver: Driver, node: str, generation: int, owner: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The ResourceSlices of the node's pool: every device (an unhealthy one tainted),
    at most 128 per slice (64 with taints), one slice (maybe empty) at least, all with
    pool `generation`."""
    devices = [slice_device(driver, d) for d in driver.plugin.devices.values()]
    per_slice = devices_per_slice(devices)
    chunks = [devices[i : i + per_slice] for i in range(0, len(devices), per_slice)] or [[]]
    bodies = []
    for index, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {
            "name": slice_name(node, driver.name, index),
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
                    "pool": {
                        "name": node,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": chunk,
                },
            }
        )
    return bodies
