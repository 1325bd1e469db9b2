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

from devplug.kube.quantity import QuantityError, parse_quantity
from devplug.kube.requests import pod_requests as kube_pod_requests
from devplug.simulator.pods import InvalidPod, PodSpec, effective_requests, parse_pod

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


def native_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """{'cpu': millicores, 'memory': bytes} of a pod spec."""
    containers: Sequence[Mapping[str, Any]] = spec.get("containers") or []
    inits: Sequence[Mapping[str, Any]] = spec.get("initContainers") or []
    return kube_pod_requests(
        (container_requests(c) for c in containers),
        ((container_requests(c), c.get("restartPolicy") == "Always") for c in inits),
    )


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
