"""Validation of the names the kubelet checks: extended resource names and device IDs.

The rules follow the kubelet's own checks so that a name devplug accepts is never
refused at registration, and the simulator refuses exactly what the kubelet refuses.
"""

from __future__ import annotations

from devplug.api.constants import MAX_DEVICE_ID_LENGTH
from devplug.kube.names import is_dns_subdomain, is_qualified_name_part

# Replicas of a device shared by several containers are named '<device>::<k>'.
REPLICA_SEPARATOR = "::"

_NATIVE_NAMESPACE = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."


def resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name, or None when it is."""
    if "/" not in name:
        return f"{name!r} has no vendor domain: expected 'vendor-domain/resource'"
    if _NATIVE_NAMESPACE in name:
        return f"{name!r} is in the kubernetes.io namespace, reserved for native resources"
    if name.startswith(_REQUESTS_PREFIX):
        return f"{name!r} must not start with {_REQUESTS_PREFIX!r}"
    prefix, _, short = (_REQUESTS_PREFIX + name).partition("/")
    if "/" in short:
        return f"{name!r} has more than one '/'"
    if not is_dns_subdomain(prefix):
        return f"{name!r}: the domain must be a lower-case DNS subdomain"
    if not is_qualified_name_part(short):
        return (
            f"{name!r}: the name after '/' must be 1-63 characters of [A-Za-z0-9-_.], "
            "starting and ending with a letter or digit"
        )
    return None


def device_id_problem(device_id: str) -> str | None:
    """Why `device_id` cannot be sent to the kubelet, or None when it can."""
    if not device_id:
        return "device ID is empty"
    if len(device_id) > MAX_DEVICE_ID_LENGTH:
        return f"device ID {device_id!r} is longer than {MAX_DEVICE_ID_LENGTH} characters"
    if not device_id.isprintable() or any(c.isspace() for c in device_id) or "," in device_id:
        return f"device ID {device_id!r} contains whitespace, commas or unprintable characters"
    return None


def this_node() -> str:
    """The node's name when none is given: $NODE_NAME (the downward API's
    spec.nodeName in a DaemonSet), else the host name."""
    import os
    import socket

    return os.environ.get("NODE_NAME") or socket.gethostname()
