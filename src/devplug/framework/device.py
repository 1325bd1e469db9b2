"""What a plugin publishes: devices, and what a container needs to use each of them.

Each device carries its own container edits (device nodes, mounts, env, annotations,
CDI names), so the framework can answer Allocate for any plugin by merging the edits
of the chosen devices; a plugin only has to describe its hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, Self

from devplug.config.ids import device_id_problem
from devplug.kube.cdi import cdi_name_problem
from devplug.kube.containers import env_problem, permissions_problem


class _DeviceNodeFields(NamedTuple):
    host_path: str
    container_path: str
    permissions: str


class DeviceNode(_DeviceNodeFields):
    """A host device node to create in the container (a DeviceSpec on the wire).

    DeviceNode and Mount are NamedTuples, immutable values as frozen dataclasses would
    be, at a fifth of their cost to define, which every daemon's start pays."""

    __slots__ = ()

    def __new__(cls, host_path: str, container_path: str = "", permissions: str = "rw") -> Self:
        if not host_path.startswith("/"):
            raise ValueError(f"device node path {host_path!r} is not absolute")
        if problem := permissions_problem(permissions):
            raise ValueError(problem)
        return super().__new__(cls, host_path, container_path or host_path, permissions)


class _MountFields(NamedTuple):
    host_path: str
    container_path: str
    read_only: bool


class Mount(_MountFields):
    """A host path to bind-mount into the container."""

    __slots__ = ()

    def __new__(cls, host_path: str, container_path: str = "", read_only: bool = False) -> Self:
        if not host_path.startswith("/"):
            raise ValueError(f"mount host path {host_path!r} is not absolute")
        return super().__new__(cls, host_path, container_path or host_path, read_only)


# A device attribute's value: a string, a number or a flag (DRA's attribute types).
Attribute = str | int | bool


def _frozen_map(values: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(values))


_EMPTY: Mapping[str, str] = MappingProxyType({})


def _repr(obj: object, names: Sequence[str]) -> str:
    shown = ", ".join(f"{name}={getattr(obj, name)!r}" for name in names)
    return f"{type(obj).__name__}({shown})"


class Device:
    """One schedulable unit of a resource, with what a container needs to use it.

    `healthy=False` keeps the device in the list (the kubelet counts it in capacity but
    not in allocatable) instead of making it vanish, which is what the kubelet expects
    of a device that failed.

    Immutable: a changed device is a new one (`replace`, `with_health`). Written out rather than
    as a frozen dataclass, which costs every daemon's start ~1 ms to define.
    """

    __match_args__ = (
        "id",
        "healthy",
        "numa_nodes",
        "nodes",
        "mounts",
        "env",
        "annotations",
        "cdi_devices",
        "attributes",
        "health_reason",
    )
    __slots__ = __match_args__

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...]
    nodes: tuple[DeviceNode, ...]
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]
    annotations: Mapping[str, str]
    cdi_devices: tuple[str, ...]
    # What the device is, for people and schedulers rather than containers: model,
    # vendor, PCI address, serial, memory... Feeds node labels, per-model pools and
    # DRA slice attributes; never sent to the kubelet.
    attributes: Mapping[str, Attribute]
    # Why an unhealthy device is so, in a few words ('Xid 79', 'node gone'): the value
    # of its DRA taint and the message of the DRA health stream; never sent to the
    # kubelet's device-plugin API, which knows no reasons.
    health_reason: str

    def __init__(
        self,
        id: str,
        healthy: bool = True,
        numa_nodes: Iterable[int] = (),
        nodes: Iterable[DeviceNode] = (),
        mounts: Iterable[Mount] = (),
        env: Mapping[str, str] = _EMPTY,
        annotations: Mapping[str, str] = _EMPTY,
        cdi_devices: Iterable[str] = (),
        attributes: Mapping[str, Attribute] = _EMPTY,
        health_reason: str = "",
    ) -> None:
        if problem := device_id_problem(id):
            raise ValueError(problem)
        # Accept any iterable from callers, store immutable values.
        put = object.__setattr__
        put(self, "id", id)
        put(self, "healthy", healthy)
        put(self, "numa_nodes", tuple(sorted(set(numa_nodes))))
        put(self, "nodes", tuple(nodes))
        put(self, "mounts", tuple(mounts))
        put(self, "env", _frozen_map(env))
        put(self, "annotations", _frozen_map(annotations))
        put(self, "cdi_devices", tuple(cdi_devices))
        put(self, "attributes", MappingProxyType(dict(attributes)))
        put(self, "health_reason", health_reason)
        for name in self.cdi_devices:
            if problem := cdi_name_problem(name):
                raise ValueError(problem)
        for key, value in self.env.items():
            if problem := env_problem(key, value):
                raise ValueError(f"device {self.id!r}: {problem}")
        if any(n < 0 for n in self.numa_nodes):
            raise ValueError(f"device {self.id!r}: NUMA node IDs must be >= 0")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Device is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Device is immutable")

    def __repr__(self) -> str:
        return _repr(self, self.__match_args__)

    def replace(self, **changes: Any) -> Device:
        """This device with `changes` to its fields, checked as a new one is."""
        values = {name: getattr(self, name) for name in self.__match_args__}
        values.update(changes)
        return Device(**values)

    __replace__ = replace  # copy.replace (Python 3.13+)

    def __reduce__(self) -> tuple[type[Device], tuple[object, ...]]:
        # Plain dicts for the read-only views, which pickle and deepcopy refuse.
        values = (getattr(self, name) for name in self.__match_args__)
        return (Device, tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values))

    def with_health(self, healthy: bool, reason: str = "") -> Device:
        reason = "" if healthy else reason
        if healthy == self.healthy and reason == self.health_reason:
            return self
        return self.replace(healthy=healthy, health_reason=reason)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        return (
            self.id,
            self.healthy,
            self.numa_nodes,
            self.nodes,
            self.mounts,
            tuple(sorted(self.env.items())),
            tuple(sorted(self.annotations.items())),
            self.cdi_devices,
            tuple(sorted(self.attributes.items())),
            self.health_reason,
        )


class ContainerEdits:
    """What one container gets: the framework's form of a ContainerAllocateResponse.

    Returned by `Plugin.allocate`; a custom hook usually takes the default result
    from `super().allocate(...)` and adds to it. (Written out rather than as a
    dataclass for the same reason as Device.)
    """

    __match_args__ = ("env", "mounts", "nodes", "annotations", "cdi_devices")
    __slots__ = __match_args__

    def __init__(
        self,
        env: dict[str, str] | None = None,
        mounts: list[Mount] | None = None,
        nodes: list[DeviceNode] | None = None,
        annotations: dict[str, str] | None = None,
        cdi_devices: list[str] | None = None,
    ) -> None:
        self.env: dict[str, str] = {} if env is None else env
        self.mounts: list[Mount] = [] if mounts is None else mounts
        self.nodes: list[DeviceNode] = [] if nodes is None else nodes
        self.annotations: dict[str, str] = {} if annotations is None else annotations
        self.cdi_devices: list[str] = [] if cdi_devices is None else cdi_devices

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContainerEdits):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__match_args__)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq is

    def __repr__(self) -> str:
        return _repr(self, self.__match_args__)


_EDIT_PARTS = (
    ("env", dict, str),
    ("annotations", dict, str),
    ("mounts", list, Mount),
    ("nodes", list, DeviceNode),
    ("cdi_devices", list, str),
)


def edits_problem(edits: object) -> str | None:
    """Why `edits`, as returned by a plugin's allocate hook, cannot go to the kubelet:
    not ContainerEdits, or parts of the wrong type, or env a container cannot take.
    (On every Allocate: empty parts, the usual case, cost one test each.)"""
    if not isinstance(edits, ContainerEdits):
        return f"returned {type(edits).__name__}, expected ContainerEdits"
    for name, kind, item in _EDIT_PARTS:
        value = getattr(edits, name)
        if not isinstance(value, kind):
            want = kind.__name__
            return f"returned ContainerEdits.{name} of {type(value).__name__}, expected {want}"
        if not value:
            continue
        every = [*value, *value.values()] if isinstance(value, dict) else value
        for wrong in every:
            if not isinstance(wrong, item):
                want = item.__name__
                return (
                    f"returned ContainerEdits.{name} holding {type(wrong).__name__}, "
                    f"expected {want}"
                )
    for key, text in edits.env.items():
        if problem := env_problem(key, text):
            return f"returned {problem}"
    return None


def any_edits(devices: Sequence[Device]) -> bool:
    """Whether any of `devices` gives a container something (virtual devices do not)."""
    for device in devices:  # a loop, not any(): this runs on every Allocate
        if device.nodes or device.mounts or device.env or device.annotations or device.cdi_devices:
            return True
    return False


def merge_edits(devices: Sequence[Device]) -> ContainerEdits:
    """Combine the edits of several devices into one container's edits.

    Device nodes and mounts are de-duplicated by container path (the first wins), so
    devices that share a node, such as the replicas of a shared device, add it once.
    An env var or annotation set by several devices to different values gets those
    values joined by commas in device order ("0,1"), the convention of the
    VISIBLE_DEVICES-style variables runtimes read.
    """
    if not any_edits(devices):
        return ContainerEdits()  # virtual devices, on every Allocate: nothing to merge
    nodes: dict[str, DeviceNode] = {}
    mounts: dict[str, Mount] = {}
    env: dict[str, dict[str, None]] = {}
    annotations: dict[str, dict[str, None]] = {}
    cdi: dict[str, None] = {}
    for device in devices:  # on every Allocate: a device's empty parts cost one test
        if device.nodes:
            for node in device.nodes:
                nodes.setdefault(node.container_path, node)
        if device.mounts:
            for mount in device.mounts:
                mounts.setdefault(mount.container_path, mount)
        if device.env:
            for key, value in device.env.items():
                _add_value(env, key, value)
        if device.annotations:
            for key, value in device.annotations.items():
                _add_value(annotations, key, value)
        if device.cdi_devices:
            cdi.update(dict.fromkeys(device.cdi_devices))
    return ContainerEdits(
        env={k: ",".join(v) for k, v in env.items()} if env else {},
        mounts=list(mounts.values()),
        nodes=list(nodes.values()),
        annotations={k: ",".join(v) for k, v in annotations.items()} if annotations else {},
        cdi_devices=list(cdi),
    )


def _add_value(values: dict[str, dict[str, None]], key: str, value: str) -> None:
    values.setdefault(key, {})[value] = None  # an insertion-ordered set
