"""A pod's requests as the scheduler and the kubelet add them up (`PodRequests`): app
containers and sidecars (restartable init containers) summed; the largest need of one
init container, with the sidecars started before it, where that is more; per resource.
Written once for extended resources (the device manager's view) and for CPU and
memory (the fit step's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, count in more.items():
        total[name] = total.get(name, 0) + count


def pod_requests(
    containers: Iterable[Mapping[str, int]],
    init_containers: Iterable[tuple[Mapping[str, int], bool]],
) -> dict[str, int]:
    """The pod's requests from its containers' and its init containers' (each with
    whether it is restartable: a sidecar)."""
    total: dict[str, int] = {}
    for container in containers:
        _add(total, container)
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for own, restartable in init_containers:
        if restartable:
            _add(total, own)
            _add(sidecars, own)
            need = dict(sidecars)
        else:
            need = dict(own)
            _add(need, sidecars)
        for name, count in need.items():
            peak[name] = max(peak.get(name, 0), count)
    for name, count in peak.items():
        total[name] = max(total.get(name, 0), count)
    return total
