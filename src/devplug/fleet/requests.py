"""A pod's CPU and memory requests as the scheduler and the kubelet add them up
(`PodRequests`): app containers and sidecars summed, the largest init container
(plus the sidecars started before it) if that is more; requests default to limits.
`pod_requests` adds the extended resources: one count for the fit step, its report and
a node's admission."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from devplug.cluster.scheduler import effective_requests
from devplug.kube.quantity import QuantityError, parse_quantity
from devplug.simulator.pods import InvalidPod, PodSpec, parse_pod

NATIVE = ("cpu", "memory")


def quantity_units(resource: str, value: object) -> int:
    """CPU in millicores, memory in bytes (rounded up, as the API server does)."""
    quantity = parse_quantity(value)
    scale = Fraction(1000) if resource == "cpu" else Fraction(1)
    return math.ceil(quantity * scale)


def container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {}) | dict(resources.get("requests") or {})
    counted: dict[str, int] = {}
    for name in NATIVE:
        if name in requests:
            try:
                counted[name] = quantity_units(name, requests[name])
            except QuantityError:
                continue
    return counted


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def native_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """{'cpu': millicores, 'memory': bytes} of a pod spec."""
    containers: Sequence[Mapping[str, Any]] = spec.get("containers") or []
    inits: Sequence[Mapping[str, Any]] = spec.get("initContainers") or []
    total: dict[str, int] = {}
    for container in containers:
        _add(total, container_requests(container))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in inits:
        own = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            need = dict(sidecars)
        else:
            need = dict(own)
            _add(need, sidecars)
        for name, value in need.items():
            peak[name] = max(peak.get(name, 0), value)
    for name, value in peak.items():
        total[name] = max(total.get(name, 0), value)
    return total


def pod_requests(
    pod: Mapping[str, Any], parsed: PodSpec | InvalidPod | None = None
) -> dict[str, int]:
    """What the scheduler's fit and the kubelet's resource check count a pod for: CPU,
    memory and extended resources (`parsed`: the pod parsed already, if it was)."""
    requests = native_requests(pod.get("spec") or {})
    parsed = parse_pod(pod) if parsed is None else parsed
    if isinstance(parsed, PodSpec):
        requests |= effective_requests(parsed)
    return requests
