"""The `mode` and `dra:` keys of a resource: how it is served (device plugin, DRA
driver, or both) and how its DRA driver publishes it; schema, meaning checks, and the
names each plugin of an entry gets (the drivers themselves are built in
devplug.sources.dradriver)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

import msgspec

from devplug.config.errors import Fail
from devplug.kube.containers import env_problem
from devplug.kube.dranames import (
    MAX_LABEL,
    attribute_name_problem,
    attribute_problem,
    default_driver_name,
    driver_name_problem,
    label_name_problem,
)
from devplug.kube.quantity import parse_quantity

MODE_DEVICE_PLUGIN = "devicePlugin"
MODE_DRA = "dra"
MODE_BOTH = "both"
Mode = Literal["devicePlugin", "dra", "both"]
MODES = (MODE_DEVICE_PLUGIN, MODE_DRA, MODE_BOTH)
# DeviceTaint effects (resource.k8s.io/v1): None is informational only.
TaintEffect = Literal["NoSchedule", "NoExecute", "None"]


# A device attribute's value (DRA's attribute types: a string, a number, a flag).
Attribute = str | int | bool
# A quantity as the API writes it ('40Gi', '100G', '8'); YAML may give a number.
Quantity = str | int


class _Spec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class PartitionSpec(_Spec):
    # A DNS label; published as '<device>-<name>'.
    name: str
    # Counter name -> how much of it the partition takes.
    consumes: dict[str, int]
    attributes: dict[str, Attribute] = {}
    env: dict[str, str] = {}


class PartitionsSpec(_Spec):
    """Each device offered as partitions instead of whole: `slots` equal slots in
    aligned partitions of `sizes` slots, or `counters` and the `devices` consuming them."""

    slots: int | None = None
    sizes: list[int] = []
    counters: dict[str, int] = {}
    devices: list[PartitionSpec] = []
    # An `nvidia` entry: each GPU in MIG mode offered as its MIG profiles at every
    # placement, made when a claim is prepared and removed when it is unprepared.
    mig: bool = False


class RangeSpec(_Spec):
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


class RequestPolicySpec(_Spec):
    default: Quantity
    valid_values: list[Quantity] = []
    valid_range: RangeSpec | None = None


class CapacitySpec(_Spec):
    # The capacity; default: the device's own of that name (its `memory`).
    value: Quantity | None = None
    request_policy: RequestPolicySpec | None = None


class DraSpec(_Spec):
    # The driver name (a DNS subdomain); default: '<resource short name>.<domain>'.
    driver: str | None = None
    # Attributes published for every device of the resource (model, vendor...).
    attributes: dict[str, Attribute] = {}
    # Published names of device attributes: {model: productName}.
    attribute_names: dict[str, str] = {}
    # The extended resource name of the resource's DeviceClass: pods asking it by
    # count (`devplug.io/null: 1`) get devices through DRA on nodes that serve it that
    # way. Default: the resource's name; '': none (claims only).
    extended_resource_name: str | None = None
    # The effect of the taint an unhealthy device gets in the slices.
    taint_effect: TaintEffect = "NoSchedule"
    # Each device offered as partitions (DRAPartitionableDevices).
    partitions: PartitionsSpec | None = None
    # Capacities several claims consume at once (DRAConsumableCapacity): each device
    # may be allocated many times, within them.
    consumable_capacity: dict[str, CapacitySpec] = {}
    # The devices need nothing done on the node (Kubernetes 1.37, alpha,
    # DRAOptionalNodeOperations): the slices say so, and a kubelet with the feature
    # calls neither NodePrepareResources nor NodeUnprepareResources for them.
    skip_node_operations: bool = False
    # Each container of a claim gets a file that describes its devices (KEP-5304,
    # beta in 1.37), bind-mounted through CDI by the runtime.
    device_metadata: bool = False


def serves_device_plugin(mode: str) -> bool:
    return mode in (MODE_DEVICE_PLUGIN, MODE_BOTH)


def serves_dra(mode: str) -> bool:
    return mode in (MODE_DRA, MODE_BOTH)


def check_attributes(attributes: dict[str, Attribute], at: str, fail: Fail) -> None:
    """Attribute names and values a ResourceSlice accepts."""
    if not attributes:
        return

    for name, value in attributes.items():
        if problem := attribute_problem(name, value):
            fail(f"{at}.{name}", problem)


def check_dra(
    spec: DraSpec,
    at: str,
    fail: Fail,
    *,
    mode: str = MODE_DRA,
    count: int = 1,
    nvidia: bool = False,
) -> None:

    if spec.driver is not None and (problem := driver_name_problem(spec.driver)):
        fail(f"{at}.driver", problem)
    if spec.skip_node_operations and spec.device_metadata:
        fail(
            f"{at}.skipNodeOperations",
            "not with 'deviceMetadata': the metadata file is written when a claim is prepared",
        )
    check_attributes(spec.attributes, f"{at}.attributes", fail)
    for key, name in spec.attribute_names.items():
        if problem := attribute_name_problem(name):
            fail(f"{at}.attributeNames.{key}", problem)
    shaped = "partitions" if spec.partitions is not None else ""
    shaped = shaped or ("consumableCapacity" if spec.consumable_capacity else "")
    if not shaped:
        return
    if spec.partitions is not None and spec.consumable_capacity:
        fail(at, "both 'partitions' and 'consumableCapacity' are set: a device has one of them")
    if mode != MODE_DRA:
        fail(
            f"{at}.{shaped}",
            f"needs mode: dra (a device plugin hands out whole devices, never {shaped})",
        )
    if count != 1:
        replicas = "'nvidia.replicas'" if nvidia else "'count'"
        fail(f"{at}.{shaped}", f"not with {replicas}: a device is shared by DRA or by replicas")
    if spec.partitions is not None and spec.partitions.mig:
        if not nvidia:
            fail(f"{at}.partitions.mig", "only for an 'nvidia' entry")
        rest = spec.partitions.slots, spec.partitions.counters, spec.partitions.sizes
        if any(rest) or spec.partitions.devices:
            fail(f"{at}.partitions", "'mig' takes its partitions from NVML: nothing else")
    elif spec.partitions is not None:
        _check_partitions(spec.partitions, f"{at}.partitions", fail)
    for name, capacity in spec.consumable_capacity.items():
        _check_capacity(name, capacity, f"{at}.consumableCapacity.{name}", fail)


def _check_partitions(spec: PartitionsSpec, at: str, fail: Fail) -> None:
    from devplug.api.dra.constants import MAX_COUNTERS_PER_SET

    if (spec.slots is None) == (not spec.counters):
        fail(at, "expected 'slots' (with 'sizes') or 'counters' (with 'devices'), one of them")
    if spec.slots is not None:
        if spec.devices:
            fail(f"{at}.devices", "not with 'slots': the sizes give the partitions")
        if not 1 <= spec.slots <= MAX_COUNTERS_PER_SET:
            fail(
                f"{at}.slots",
                f"expected 1 to {MAX_COUNTERS_PER_SET} (a counter per slot), got {spec.slots}",
            )
        if not spec.sizes:
            fail(f"{at}.sizes", "expected the partition sizes, in slots ([1, 2, 4])")
        for k, size in enumerate(spec.sizes):
            if not 1 <= size <= spec.slots:
                fail(f"{at}.sizes[{k}]", f"expected 1 to {spec.slots} slots, got {size}")
        return
    if spec.sizes:
        fail(f"{at}.sizes", "only with 'slots'")
    if len(spec.counters) > MAX_COUNTERS_PER_SET:
        fail(f"{at}.counters", f"{len(spec.counters)} counters, more than {MAX_COUNTERS_PER_SET}")
    for name, value in spec.counters.items():
        if problem := label_name_problem("counter", name):
            fail(f"{at}.counters.{name}", problem)
        if value < 1:
            fail(f"{at}.counters.{name}", f"expected an integer >= 1, got {value}")
    if not spec.devices:
        fail(f"{at}.devices", "expected at least one partition")
    seen: set[str] = set()
    for k, partition in enumerate(spec.devices):
        where = f"{at}.devices[{k}]"
        if problem := label_name_problem("partition", partition.name):
            fail(f"{where}.name", problem)
        if partition.name in seen:
            fail(f"{where}.name", f"partition {partition.name!r} is listed twice")
        seen.add(partition.name)
        if not partition.consumes:
            fail(f"{where}.consumes", "expected the counters the partition takes")
        for counter, amount in partition.consumes.items():
            if counter not in spec.counters:
                fail(f"{where}.consumes.{counter}", f"no counter {counter!r} in 'counters'")
            if not 1 <= amount <= spec.counters[counter]:
                fail(
                    f"{where}.consumes.{counter}",
                    f"expected 1 to {spec.counters[counter]}, got {amount}",
                )
        check_attributes(partition.attributes, f"{where}.attributes", fail)
        for key, text in partition.env.items():
            if problem := env_problem(key, text):
                fail(f"{where}.env", problem)


def quantity(value: Quantity) -> Fraction:
    """A quantity's value ('1Gi' -> 1073741824); ValueError when it is none."""
    return parse_quantity(value)


def _check_capacity(name: str, spec: CapacitySpec, at: str, fail: Fail) -> None:
    """What the API server checks of a shared capacity, so that a config it would
    refuse stops at start with one line instead of failing each publish."""
    from devplug.api.dra.constants import MAX_VALID_VALUES

    if problem := attribute_name_problem(name):
        fail(at, problem)

    def parsed(value: Quantity, where: str) -> Fraction:
        try:
            amount = quantity(value)
        except ValueError:
            fail(where, f"{value!r} is not a quantity ('40Gi', '100G', '8')")
        if amount < 0:
            fail(where, f"expected a quantity >= 0, got {value!r}")
        return amount

    total = parsed(spec.value, f"{at}.value") if spec.value is not None else None
    if total is None and name != "memory":
        fail(f"{at}.value", "required: only 'memory' comes from the devices themselves")
    policy = spec.request_policy
    if policy is None:
        return
    where = f"{at}.requestPolicy"
    default = parsed(policy.default, f"{where}.default")
    if policy.valid_values and policy.valid_range is not None:
        fail(where, "both 'validValues' and 'validRange' are set: a policy has one of them")
    if total is not None and default > total:
        fail(f"{where}.default", f"{policy.default!r} is more than the capacity {spec.value!r}")
    if policy.valid_values:
        if len(policy.valid_values) > MAX_VALID_VALUES:
            fail(f"{where}.validValues", f"more than {MAX_VALID_VALUES} values")
        values = [parsed(v, f"{where}.validValues[{k}]") for k, v in enumerate(policy.valid_values)]
        if values != sorted(set(values)):
            fail(f"{where}.validValues", "values must be distinct and in ascending order")
        if default not in values:
            fail(f"{where}.default", f"{policy.default!r} is not one of the valid values")
        if total is not None and values[-1] > total:
            fail(f"{where}.validValues", f"{policy.valid_values[-1]!r} is more than the capacity")
    if policy.valid_range is not None:
        bounds = policy.valid_range
        low = parsed(bounds.min, f"{where}.validRange.min")
        high = parsed(bounds.max, f"{where}.validRange.max") if bounds.max is not None else None
        step = parsed(bounds.step, f"{where}.validRange.step") if bounds.step is not None else None
        if total is not None and high is not None and high > total:
            fail(f"{where}.validRange.max", f"{bounds.max!r} is more than the capacity")
        if total is not None and low > total:
            fail(f"{where}.validRange.min", f"{bounds.min!r} is more than the capacity")
        if not low <= default <= (high if high is not None else default):
            fail(f"{where}.default", f"{policy.default!r} is outside the valid range")
        if step is not None:
            if step <= 0:
                fail(f"{where}.validRange.step", f"expected a quantity > 0, got {bounds.step!r}")
            if (default - low) % step:
                fail(f"{where}.default", f"{policy.default!r} is not min plus a number of steps")
            if total is not None and low + step > total:
                fail(f"{where}.validRange.step", "min plus one step is more than the capacity")
            if high is not None and (high - low) % step:
                fail(f"{where}.validRange.max", f"{bounds.max!r} is not min plus a number of steps")


def driver_name(resource_name: str, spec: DraSpec | None) -> str:
    """The resource's DRA driver: `dra.driver`, or one derived from the resource name."""
    if spec is not None and spec.driver is not None:
        return spec.driver

    return default_driver_name(resource_name)


def plugin_driver_name(resource_name: str, spec_name: str, spec: DraSpec | None) -> str:
    """The driver of one plugin of a config entry. Without `dra.driver`, one derived
    from the plugin's resource name. With it, the entry's own resource gets it, and the
    further resources an entry serves (a GPU entry's MIG profiles or models) get
    '<their short name>.<dra.driver>'."""

    if spec is None or spec.driver is None:
        return default_driver_name(resource_name)
    if resource_name == spec_name:
        return spec.driver
    label = default_driver_name(resource_name).partition(".")[0]
    return f"{label}.{spec.driver}"[:MAX_LABEL].rstrip(".-")


def extended_resource_name(
    resource_name: str, spec_name: str, mode: str, spec: DraSpec | None
) -> str | None:
    """The extended resource name the DeviceClass of one plugin of a config entry
    carries, or None. `dra.extendedResourceName` names the entry's own resource; the
    further resources of an entry (a split's models, a GPU entry's MIG profiles) keep
    their own names, except in `both` mode, where those names are the device plugin's."""
    explicit = spec.extended_resource_name if spec is not None else None
    if explicit == "":
        return None
    if resource_name == spec_name:
        return explicit or resource_name
    return None if explicit is not None or mode == MODE_BOTH else resource_name


def served_twice(
    entries: Sequence[tuple[str, str, DraSpec | None]],
) -> tuple[int, str] | None:
    """(entry index, problem) when a name would be served on a node both as a device
    plugin and as the extended resource of a DRA DeviceClass, which the scheduler
    forbids (KEP 5004: a node serves an extended resource one way). `entries` are
    (resource name, mode, dra spec) of each config entry."""
    counted = {name for name, mode, _ in entries if serves_device_plugin(mode)}
    for index, (name, mode, spec) in enumerate(entries):
        if not serves_dra(mode):
            continue
        extended = extended_resource_name(name, name, mode, spec)
        if extended is not None and extended in counted:
            how = (
                f"mode '{mode}' serves {name!r} as a device plugin"
                if extended == name
                else f"{extended!r} is served as a device plugin"
            )
            return index, (
                f"{how} and as the extended resource of its DRA DeviceClass "
                "(dra.extendedResourceName): a node serves a name one way; set "
                "dra.extendedResourceName to another name or to '' (claims only), or "
                "choose the mode per node with nodeModeLabel"
            )
    return None
