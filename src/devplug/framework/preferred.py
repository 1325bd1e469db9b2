"""The default GetPreferredAllocation policy: as few NUMA nodes as possible, and the
replicas of shared devices spread over as many physical devices as possible."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from devplug.config.ids import REPLICA_SEPARATOR, physical_id
from devplug.framework.device import Device


def spread_replicas(devices: Sequence[Device], taken: Sequence[Device] = ()) -> list[Device]:
    """`devices` reordered so that each physical device comes once before any comes
    twice, the least loaded first (the most replicas still free among `devices`),
    and none already in `taken` before all others have come: a container asking for
    two shares gets two devices where it can, and load spreads over the devices."""
    ids = {d.id for d in devices}
    if (
        len(ids) == len(devices)
        # joined by NUL, which is no ':', a separator found lies within one ID
        and REPLICA_SEPARATOR not in "\0".join(ids)
        and not any(REPLICA_SEPARATOR in d.id or d.id in ids for d in taken)
    ):
        # No replicas, none listed twice, none taken: each comes once and first, in
        # order (the common case, and the one of a thousand devices offered at once).
        return list(devices)
    return _spread_order(devices, taken)


def _spread_order(devices: Sequence[Device], taken: Sequence[Device]) -> list[Device]:
    """`spread_replicas` in general: each device keyed by how often its physical device
    came before (taken or listed), then by how many of its replicas are free."""
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


# -- policies by name ------------------------------------------------------------------


def prefer_spread(
    available: Sequence[Device], must_include: Sequence[Device], size: int
) -> list[str]:
    """Replicas of different physical devices first, the least loaded first."""
    chosen = {d.id: d for d in must_include}
    rest = [d for d in available if d.id not in chosen]
    for device in spread_replicas(rest, list(chosen.values()))[: max(0, size - len(chosen))]:
        chosen[device.id] = device
    return list(chosen)


def prefer_pack(
    available: Sequence[Device], must_include: Sequence[Device], size: int
) -> list[str]:
    """Fill one physical device's replicas before using another: devices already in
    `must_include` first, then those with the fewest free replicas (already in use
    elsewhere), keeping whole devices free for requests that need them."""
    chosen = {d.id: d for d in must_include}
    free = Counter(physical_id(d.id) for d in available)
    used = {physical_id(d) for d in chosen}
    order = {physical_id(d.id): i for i, d in reversed(list(enumerate(available)))}
    rest = sorted(
        (d for d in available if d.id not in chosen),
        key=lambda d: (
            physical_id(d.id) not in used,
            free[physical_id(d.id)],
            order[physical_id(d.id)],
        ),
    )
    for device in rest[: max(0, size - len(chosen))]:
        chosen[device.id] = device
    return list(chosen)


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefer_pci_close(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    paths: Mapping[str, tuple[str, ...]],
) -> list[str]:
    """Devices closest by PCI topology: `paths` gives each physical device's chain of
    PCI addresses from its root bus (bridges, switch ports, the device). Greedily add
    the device sharing the longest chain with one already picked (same switch, then
    same root port...); with nothing to start from, try each physical device as the
    start and keep the tightest set. Ties keep the kubelet's order."""

    def path(device: Device) -> tuple[str, ...]:
        return paths.get(physical_id(device.id), ())

    chains = [path(d) for d in available]

    def grow(start: list[Device]) -> tuple[list[Device], int]:
        # Each device's closeness to the picks so far, updated as picks are added:
        # one pass over the devices per pick.
        picked = list(start)
        ids = {d.id for d in picked}
        closeness = [max((_common(chain, path(p)) for p in picked), default=0) for chain in chains]
        score = 0
        while len(picked) < size:
            best: tuple[int, int] | None = None
            for i, device in enumerate(available):
                if device.id not in ids and (best is None or (-closeness[i], i) < best):
                    best = (-closeness[i], i)
            if best is None:
                break
            device = available[best[1]]
            picked.append(device)
            ids.add(device.id)
            score += -best[0]
            added = chains[best[1]]
            closeness = [
                max(c, _common(chain, added)) for c, chain in zip(closeness, chains, strict=True)
            ]
        return picked, score

    if must_include or size == 0:
        picked, _ = grow(list(must_include))
    else:
        # Replicas of one device grow the same set, and the first of them wins a tie:
        # one start per physical device.
        first: dict[str, Device] = {}
        for device in available:
            first.setdefault(physical_id(device.id), device)
        starts = list(first.values())
        picked, best_score = grow([starts[0]])
        for device in starts[1:]:
            candidate, score = grow([device])
            if score > best_score:
                picked, best_score = candidate, score
    return [d.id for d in picked[:size]] if size else []


def pick(
    policy: str,
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    paths: Mapping[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """The preferred allocation of a named policy ('numa', 'pack', 'spread', 'pci')."""
    if policy == "pack":
        return prefer_pack(available, must_include, size)
    if policy == "spread":
        return prefer_spread(available, must_include, size)
    if policy == "pci":
        return prefer_pci_close(available, must_include, size, paths or {})
    return prefer_numa_local(available, must_include, size)
