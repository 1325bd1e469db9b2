"""Device IDs, in one place: what the kubelet accepts as one, how devplug derives one
from a path or an index, how it shortens one that is too long, and how replicas of a
shared device are named ('<id>::<k>'), and the variables that hand a container its
allocated IDs. The framework checks Devices by these rules,
and the config and the sources make IDs by them."""

from __future__ import annotations

import posixpath
import re

from devplug.api.constants import MAX_DEVICE_ID_LENGTH

# Replicas of a device shared by several containers are named '<device>::<k>'.
REPLICA_SEPARATOR = "::"

# Patterns are compiled on first use (re keeps them): a plugin daemon starts without
# compiling those it never needs.
_UNSAFE_ID_CHARS = r"[\s,]|[^\x20-\x7e]"
_ENV_UNSAFE = r"[^A-Za-z0-9]"


def device_id_problem(device_id: str) -> str | None:
    """Why `device_id` cannot be sent to the kubelet, or None when it can."""
    if not device_id:
        return "device ID is empty"
    if len(device_id) > MAX_DEVICE_ID_LENGTH:
        return f"device ID {device_id!r} is longer than {MAX_DEVICE_ID_LENGTH} characters"
    if not device_id.isprintable() or any(c.isspace() for c in device_id) or "," in device_id:
        return f"device ID {device_id!r} contains whitespace, commas or unprintable characters"
    return None


def path_device_id(path: str) -> str:
    """'/dev/bus/usb/001/002' -> 'bus-usb-001-002' (outside /dev: '/a/b' -> 'a-b').

    Not capped: see `cap_id`.
    """
    path = posixpath.normpath(path)
    stem = path.removeprefix("/dev/") if path.startswith("/dev/") else path.lstrip("/")
    return re.sub(_UNSAFE_ID_CHARS, "_", stem.replace("/", "-")) or "root"


def virtual_device_id(resource_name: str, index: int) -> str:
    """The `index`th virtual device of 'example.com/fake': 'fake-<index>'."""
    return f"{resource_name.rpartition('/')[2]}-{index}"


def cap_id(device_id: str, limit: int = MAX_DEVICE_ID_LENGTH) -> str:
    """`device_id` if it fits in `limit` characters, else a prefix plus '-' and 10 hex
    characters of its sha256: unique and stable across restarts."""
    if len(device_id) <= limit:
        return device_id
    import hashlib  # only for long IDs: it loads OpenSSL (~0.7 MiB)

    digest = hashlib.sha256(device_id.encode()).hexdigest()[:10]
    return f"{device_id[: limit - 11]}-{digest}"


def replica_ids(device_id: str, count: int) -> list[str]:
    """The IDs a device is served under: itself, or '<id>::<k>' for each of `count`
    replicas; the base is shortened (`cap_id`) so that every ID fits the kubelet's limit."""
    if count == 1:
        return [cap_id(device_id)]
    base = cap_id(device_id, MAX_DEVICE_ID_LENGTH - len(f"{REPLICA_SEPARATOR}{count - 1}"))
    return [f"{base}{REPLICA_SEPARATOR}{k}" for k in range(count)]


def physical_id(device_id: str) -> str:
    """The device a replica ID belongs to ('gpu0::3' -> 'gpu0'); other IDs are their own."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def env_word(text: str) -> str:
    """`text` as part of an env variable's name: 'example.com/kvm' -> 'EXAMPLE_COM_KVM'."""
    return re.sub(_ENV_UNSAFE, "_", text).upper()


def ids_env_name(resource_name: str) -> str:
    """'example.com/kvm' -> 'DEVPLUG_EXAMPLE_COM_KVM'."""
    return "DEVPLUG_" + env_word(resource_name)


def pci_resource_env(resource_name: str) -> str:
    """KubeVirt's variable for the PCI addresses of a resource:
    'example.com/fpga-u280' -> 'PCI_RESOURCE_EXAMPLE_COM_FPGA-U280'."""
    return "PCI_RESOURCE_" + resource_name.upper().replace("/", "_").replace(".", "_")
