"""What the scheduler guarantees of an allocation, checked for the claims the simulator
reads from a folder (no scheduler made them): every allocated device is in the
newest slices of its pool; a device that is not shareable is held by one claim; the
partitions allocated never consume more than their counter sets hold; the shares of
a shared device carry a share ID, consume valid amounts and stay within its capacity;
a tainted device goes only to a request that tolerates its taint.

The slices are the documents the drivers write beside the claims (`devplug serve
--claims-dir`). A claim that breaks one of these rules is refused as the scheduler
would have left its pod: unschedulable, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from devplug.framework.dra.claims import folder_documents
from devplug.kube.quantity import parse_quantity

DeviceKey = tuple[str, str, str]  # driver, pool, device (or counter set)


class InvalidAllocation(Exception):
    """The allocation is one the scheduler would never have made."""


@dataclass(slots=True)
class Pools:
    """The newest slices of every pool: their devices and counter sets."""

    devices: dict[DeviceKey, Mapping[str, Any]] = field(default_factory=dict)
    counters: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)


def read_pools(folder: Path) -> Pools:
    """The ResourceSlice documents of `folder`, newest pool generation only."""
    newest: dict[tuple[str, str], int] = {}
    slices: list[Mapping[str, Any]] = []
    for doc in folder_documents(folder, "ResourceSlice"):
        spec = doc.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation", 0)))
        slices.append(spec)
    pools = Pools()
    for spec in slices:
        driver, pool = str(spec.get("driver")), str(spec["pool"].get("name"))
        if int(spec["pool"].get("generation", 0)) != newest[(driver, pool)]:
            continue
        for device in spec.get("devices") or []:
            pools.devices[(driver, pool, str(device.get("name")))] = device
        for counter_set in spec.get("sharedCounters") or []:
            pools.counters[(driver, pool, str(counter_set.get("name")))] = {
                name: _quantity(c.get("value")) for name, c in counter_set["counters"].items()
            }
    return pools


def _quantity(value: Any) -> Fraction:
    return parse_quantity(str(value))


def _key(result: Mapping[str, Any]) -> DeviceKey:
    return (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))


def _short(name: str) -> str:
    """A capacity or counter name without the driver's domain."""
    return name.rpartition("/")[2]


def check(
    claim: str,
    results: Sequence[Mapping[str, Any]],
    others: Iterable[tuple[str, Sequence[Mapping[str, Any]]]],
    pools: Pools,
) -> None:
    """Refuse `claim`'s allocation `results` if the scheduler could not have made it
    while the claims of `others` (name, results) hold theirs."""
    held: dict[DeviceKey, str] = {}
    used: dict[tuple[DeviceKey, str], Fraction] = {}
    consumed: dict[tuple[DeviceKey, str], Fraction] = {}
    for other, other_results in others:
        for result in other_results:
            if result.get("adminAccess"):
                continue
            key = _key(result)
            device = pools.devices.get(key)
            if device is None:
                continue
            if not device.get("allowMultipleAllocations"):
                held[key] = other
            _add_counters(device, key, used)
            for name, amount in (result.get("consumedCapacity") or {}).items():
                slot = (key, _short(name))
                consumed[slot] = consumed.get(slot, Fraction(0)) + _quantity(amount)
    for result in results:
        key = _key(result)
        device = pools.devices.get(key)
        if device is None:
            raise InvalidAllocation(
                f"claim {claim}: device {key[2]} of driver {key[0]} is in no ResourceSlice of "
                f"pool {key[1]}"
            )
        _check_taints(claim, key, device, result)
        if result.get("adminAccess"):
            continue
        if not device.get("allowMultipleAllocations"):
            if key in held:
                raise InvalidAllocation(
                    f"claim {claim}: device {key[2]} is already allocated to claim {held[key]}"
                )
            held[key] = claim
        else:
            _check_share(claim, key, device, result, consumed)
        for (set_key, counter), total in _add_counters(device, key, used).items():
            limit = pools.counters.get(set_key, {}).get(counter)
            if limit is None or total > limit:
                raise InvalidAllocation(
                    f"claim {claim}: partition {key[2]} needs counter {counter} of counter set "
                    f"{set_key[2]} beyond its {limit if limit is not None else 0}: "
                    "it overlaps a partition already allocated"
                )


def _check_taints(
    claim: str, key: DeviceKey, device: Mapping[str, Any], result: Mapping[str, Any]
) -> None:
    """A tainted device (NoSchedule or NoExecute) only for a request that tolerates it:
    the scheduler copies the request's tolerations into the result."""
    from devplug.kube.tolerations import tolerates

    tolerations = [t for t in result.get("tolerations") or () if isinstance(t, Mapping)]
    for taint in device.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            shown = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            raise InvalidAllocation(
                f"claim {claim}: device {key[2]} has the taint {shown}, which the claim "
                "does not tolerate"
            )


def _add_counters(
    device: Mapping[str, Any], key: DeviceKey, used: dict[tuple[DeviceKey, str], Fraction]
) -> dict[tuple[DeviceKey, str], Fraction]:
    """Add what `device` consumes to `used`; the new totals of those counters."""
    totals = {}
    for consumption in device.get("consumesCounters") or []:
        set_key = (key[0], key[1], str(consumption.get("counterSet")))
        for counter, amount in (consumption.get("counters") or {}).items():
            slot = (set_key, counter)
            used[slot] = used.get(slot, Fraction(0)) + _quantity(amount.get("value"))
            totals[slot] = used[slot]
    return totals


def _check_share(
    claim: str,
    key: DeviceKey,
    device: Mapping[str, Any],
    result: Mapping[str, Any],
    consumed: dict[tuple[DeviceKey, str], Fraction],
) -> None:
    if not result.get("shareID"):
        raise InvalidAllocation(f"claim {claim}: share of device {key[2]} has no shareID")
    amounts = {_short(k): _quantity(v) for k, v in (result.get("consumedCapacity") or {}).items()}
    for name, capacity in (device.get("capacity") or {}).items():
        if name not in amounts:
            raise InvalidAllocation(
                f"claim {claim}: share of device {key[2]} has no consumedCapacity {name}"
            )
        amount = amounts[name]
        if problem := _policy_problem(amount, capacity.get("requestPolicy")):
            raise InvalidAllocation(f"claim {claim}: {name} of device {key[2]}: {problem}")
        total = consumed.get((key, name), Fraction(0)) + amount
        value = _quantity(capacity.get("value"))
        if total > value:
            raise InvalidAllocation(
                f"claim {claim}: {name} of device {key[2]}: {total - amount} of {value} "
                f"is allocated, {amount} more does not fit"
            )
        consumed[(key, name)] = total


def _policy_problem(amount: Fraction, policy: Mapping[str, Any] | None) -> str | None:
    """Why the scheduler would never consume `amount` under `policy` (it rounds a
    request up to a valid amount)."""
    if not policy:
        return None
    values = [_quantity(v) for v in policy.get("validValues") or []]
    if values and amount not in values:
        return f"{amount} is not one of the valid values"
    bounds = policy.get("validRange")
    if bounds:
        low = _quantity(bounds.get("min"))
        high = _quantity(bounds["max"]) if bounds.get("max") is not None else None
        step = _quantity(bounds["step"]) if bounds.get("step") is not None else None
        if amount < low or (high is not None and amount > high):
            return f"{amount} is outside the valid range"
        if step is not None and (amount - low) % step:
            return f"{amount} is not min plus a number of steps"
    return None
