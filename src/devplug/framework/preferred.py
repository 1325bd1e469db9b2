"""The default GetPreferredAllocation policy: as few NUMA nodes as possible, and the
replicas of shared devices spread over as many physical devices as possible."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from devplug.framework.device import Device
from devplug.framework.names import REPLICA_SEPARATOR


def physical_id(device_id: str) -> str:
    """The device a replica ID belongs to ('gpu0::3' -> 'gpu0'); other IDs are their own."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def spread_replicas(devices: Sequence[Device], taken: Sequence[Device] = ()) -> list[Device]:
    """`devices` reordered so that each physical device comes once before any comes
    twice, the least loaded first (the most replicas still free among `devices`),
    and none already in `taken` before all others have come: a container asking for
    two shares gets two devices where it can, and load spreads over the devices."""
    free = Counter(physical_id(d.id) for d in devices)
    seen = Counter(physical_id(d.id) for d in taken)
    keyed = []
    for position, device in enumerate(devices):
        physical = physical_id(device.id)
        keyed.append(((seen[physical], -free[physical], position), device))
        seen[physical] += 1
    return [device for _, device in sorted(keyed, key=lambda item: item[0])]


def prefer_numa_local(
    available: Sequence[Device], must_include: Sequence[Device], size: int
) -> list[str]:
    """Pick `size` devices: all of `must_include`, then the rest from the NUMA nodes that
    already hold picks, then from the nodes that can supply the most of what is left.

    A node that can fill the whole remainder on its own beats a bigger node that is
    not needed, so a 2-device request on nodes with 4 and 2 free devices prefers a
    single node either way but leaves the larger node whole when the smaller fits.
    Within one node, replicas are spread (`spread_replicas`); otherwise devices keep
    the order the kubelet offered them in.
    """
    chosen = {d.id: d for d in must_include}
    need = size - len(chosen)
    if need <= 0:
        return list(chosen)
    groups: dict[tuple[int, ...], list[Device]] = {}
    for device in available:
        if device.id not in chosen:
            groups.setdefault(device.numa_nodes, []).append(device)
    used = {n for d in chosen.values() for n in d.numa_nodes}

    def rank(item: tuple[tuple[int, ...], list[Device]]) -> tuple[bool, bool, int]:
        nodes, devices = item
        fits = len(devices) >= need
        # On a node already used first; then one that fits alone, smallest such first
        # (best fit); else the biggest, to spread over as few nodes as possible.
        return (
            not (set(nodes) <= used and bool(nodes)),
            not fits,
            len(devices) if fits else -len(devices),
        )

    for _, devices in sorted(groups.items(), key=rank):
        for device in spread_replicas(devices, list(chosen.values()))[:need]:
            chosen[device.id] = device
        need = size - len(chosen)
        if need <= 0:
            break
    return list(chosen)
