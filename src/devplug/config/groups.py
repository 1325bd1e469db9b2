"""A resource's `groups:`: the device nodes, mounts, env and CDI names each device of a
group gives a container, or the sysfs selector that finds its devices; their meaning
checks, and the ID of a group that names one device."""

from __future__ import annotations

import glob
import posixpath
from collections.abc import Mapping

import msgspec

from devplug.config import hardware
from devplug.config.dra import check_attributes
from devplug.config.errors import Fail, int_problem
from devplug.config.ids import REPLICA_SEPARATOR, device_id_problem, path_device_id
from devplug.kube.cdi import cdi_name_problem
from devplug.kube.containers import env_problem, permissions_problem

MAX_COUNT = 1000


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class PathSpec(_Schema):
    path: str
    permissions: str = "rw"
    # Ending in '/': a folder, where the node keeps its own name (allowed on a glob).
    container_path: str = ""
    # A node the device is served without while it is missing (left out of Allocate).
    optional: bool = False


class MountSpec(_Schema):
    host_path: str
    container_path: str = ""
    read_only: bool = False
    # required: the device is Unhealthy while host_path is missing; optional: the mount
    # is left out while it is missing; neither: mounted as it is.
    required: bool = False
    optional: bool = False


class GroupSpec(_Schema):
    # Required unless the group has a `usb` or `pci` selector.
    paths: list[PathSpec] = []
    # The device's ID instead of one derived from its first path (groups with no glob).
    id: str | None = None
    mounts: list[MountSpec] = []
    env: dict[str, str] = {}
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []
    numa_node: int | None = None
    # Devices selected by what they are, read in sysfs (sources/hardware.py).
    usb: hardware.UsbSelector | None = None
    pci: hardware.PciSelector | None = None
    # What the devices are (model, vendor...): node labels, pools, DRA attributes.
    attributes: dict[str, str | int | bool] = {}
    # Replicas of each device of this group (default: the resource's count).
    count: int | None = None


def is_selector(group: GroupSpec) -> bool:
    """Whether the group selects devices in sysfs (its paths then join each device)."""
    return group.usb is not None or group.pci is not None


def check_group(
    group: GroupSpec,
    at: str,
    allow_any_path: bool,
    reserved_env: Mapping[str, str],
    fail: Fail,
) -> None:
    if group.usb is not None and group.pci is not None:
        fail(at, "both 'usb' and 'pci' are set: a group selects one kind of device")
    if group.usb is not None:
        hardware.check_usb(group.usb, f"{at}.usb", fail)
    if group.pci is not None:
        hardware.check_pci(group.pci, f"{at}.pci", fail)
    if not group.paths and not is_selector(group) and not required_mounts(group):
        fail(
            f"{at}.paths",
            "expected at least one path (or a 'usb' or 'pci' selector, or a required mount)",
        )
    if is_selector(group):
        if group.id is not None:
            fail(f"{at}.id", "not allowed with a selector: each selected device has its own ID")
        for k, spec in enumerate(group.paths):
            if has_glob(spec.path):
                fail(f"{at}.paths[{k}].path", "no glob with a selector: use {placeholders}")
            hardware.check_placeholders(spec.path, f"{at}.paths[{k}].path", fail)
    if group.id is not None:
        if any(has_glob(p.path) for p in group.paths):
            fail(f"{at}.id", "not allowed with a glob path: each match is a device of its own")
        if problem := device_id_problem(group.id):
            fail(f"{at}.id", problem)
        if REPLICA_SEPARATOR in group.id:
            fail(
                f"{at}.id",
                f"{group.id!r} contains {REPLICA_SEPARATOR!r}, the separator of shared replicas",
            )
    for k, spec in enumerate(group.paths):
        where = f"{at}.paths[{k}]"
        if problem := host_path_problem(spec.path, allow_any_path):
            fail(f"{where}.path", problem)
        if problem := permissions_problem(spec.permissions):
            fail(f"{where}.permissions", problem)
        if spec.container_path:
            if problem := path_problem(spec.container_path):
                fail(f"{where}.containerPath", problem)
            if has_glob(spec.path) and not spec.container_path.endswith("/"):
                fail(
                    f"{where}.containerPath",
                    "not allowed on a glob path unless it is a folder (ending in '/'): "
                    "every match would get the same container path",
                )
    for k, mount in enumerate(group.mounts):
        where = f"{at}.mounts[{k}]"
        if problem := path_problem(mount.host_path):
            fail(f"{where}.hostPath", problem)
        if has_glob(mount.host_path):
            fail(f"{where}.hostPath", "a mount names one path: globs are not expanded here")
        if mount.container_path and (problem := path_problem(mount.container_path)):
            fail(f"{where}.containerPath", problem)
        if mount.required and mount.optional:
            fail(where, "both 'required' and 'optional' are set: a mount is one or the other")
    if group.count is not None and (problem := int_problem(group.count, 1, MAX_COUNT)):
        fail(f"{at}.count", problem)
    for key, value in group.env.items():
        if problem := env_problem(key, value):
            fail(f"{at}.env", problem)
        if key in reserved_env:
            fail(f"{at}.env.{key}", f"set by devplug to {reserved_env[key]}: use another name")
    for k, name in enumerate(group.cdi_devices):
        if problem := cdi_name_problem(name):
            fail(f"{at}.cdiDevices[{k}]", problem)
    if group.numa_node is not None and group.numa_node < 0:
        fail(f"{at}.numaNode", f"expected an integer >= 0, got {group.numa_node}")
    check_attributes(group.attributes, f"{at}.attributes", fail)


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file of the host or container: it must be absolute,
    without NUL and without '..' (no climbing out of the folder it names)."""
    if not path.startswith("/"):
        return f"expected an absolute path, got {path!r}"
    if "\0" in path:
        return "the path contains a NUL character"
    if ".." in path.split("/"):
        return f"{path!r} contains '..': name the folder directly"
    return None


def host_path_problem(path: str, allow_any_path: bool) -> str | None:
    if problem := path_problem(path):
        return problem
    if not allow_any_path and not posixpath.normpath(path).startswith("/dev/"):
        return f"{path!r} is outside /dev (set 'allowAnyPath: true' on the resource to allow it)"
    return None


def has_glob(path: str) -> bool:
    return glob.has_magic(path)


def group_device_id(group: GroupSpec) -> str:
    """The ID of a group with no glob: its `id`, or one derived from its first path (or
    required mount)."""
    if group.id is not None:
        return group.id
    return path_device_id(group.paths[0].path if group.paths else required_mounts(group)[0])


def required_mounts(group: GroupSpec) -> list[str]:
    """The host paths of the mounts a group's devices need (Unhealthy while missing)."""
    return [m.host_path for m in group.mounts if m.required]
