"""The names DRA objects accept: driver names, device names, attribute names.

Attribute and capacity names are checked by the rule of Kubernetes 1.38, stricter than
1.36's and 1.37's (which let 'a/b/c' through): so devplug never publishes a name that a
newer API server would refuse.

devplug's device IDs allow characters a ResourceSlice does not ('::', '_', upper
case), so each device is published under a DNS label derived from its ID, stable
across restarts.
"""

from __future__ import annotations

import re

from devplug.kube.names import MAX_DNS_LABEL, is_dns_label, is_dns_subdomain

_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_LABEL = re.compile(r"[^a-z0-9]+")
MAX_LABEL = MAX_DNS_LABEL
# resource.k8s.io's limits on a device attribute: its name after the domain, a string value.
MAX_ATTRIBUTE_NAME_LENGTH = 32
MAX_STRING_ATTRIBUTE_LENGTH = 64


def driver_name_problem(name: str) -> str | None:
    """Why `name` cannot be a DRA driver name (a DNS subdomain of at most 63 characters)."""
    if not is_dns_subdomain(name, MAX_LABEL):
        return (
            f"driver name {name!r} must be a lower-case DNS subdomain of at most "
            f"{MAX_LABEL} characters, e.g. 'gpu.example.com'"
        )
    return None


def default_driver_name(resource_name: str) -> str:
    """'devplug.io/zero' -> 'zero.devplug.io': the resource's own domain, so that two
    resources of one vendor get two drivers."""
    domain, _, short = resource_name.partition("/")
    label = _NOT_LABEL.sub("-", short.lower()).strip("-") or "device"
    return f"{label}.{domain}"[:MAX_LABEL].rstrip(".-")


def device_name(device_id: str) -> str:
    """The DNS label a device is published under: 'null::0' -> 'null-0'. An ID that
    needs changing gets 8 hex characters of its sha256 appended, so that two IDs
    never meet on one name ('a_b' and 'a-b')."""
    if is_dns_label(device_id):
        return device_id
    label = _NOT_LABEL.sub("-", device_id.lower()).strip("-") or "device"
    import hashlib  # only for IDs that need it: it loads OpenSSL (~0.7 MiB)

    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    return f"{label[: MAX_LABEL - 9].rstrip('-')}-{digest}"


def label_name_problem(kind: str, name: str) -> str | None:
    """Why `name` cannot be the name of a `kind` that the API wants as a DNS label (a
    counter, a partition: both are published under that name)."""
    if not is_dns_label(name):
        return f"{kind} name {name!r} must be a lower-case DNS label ('slot-0')"
    return None


def attribute_name_problem(name: str) -> str | None:
    """Why `name` cannot be an attribute or capacity name of a slice device: a C
    identifier of at most 32 characters, alone (the driver's own) or after one domain
    and one '/' ('resource.kubernetes.io/numaNode')."""
    domain, slash, short = name.rpartition("/")
    if slash and (not domain or "/" in domain):
        return (
            f"attribute name {name!r} must be '<domain>/<name>' with one '/' and both "
            "parts set, or a name without a domain"
        )
    if slash and not is_dns_subdomain(domain, MAX_LABEL):
        return (
            f"attribute name {name!r}: the domain must be a lower-case DNS subdomain of "
            f"at most {MAX_LABEL} characters"
        )
    if len(short) > MAX_ATTRIBUTE_NAME_LENGTH or not _C_IDENTIFIER.match(short):
        return (
            f"attribute name {name!r} must be a C identifier of at most "
            f"{MAX_ATTRIBUTE_NAME_LENGTH} characters{' after the domain' if slash else ''}"
        )
    return None


def attribute_problem(name: str, value: str | int | bool) -> str | None:
    """Why a device cannot carry the attribute `name: value` in a slice, or None."""
    if problem := attribute_name_problem(name):
        return problem
    if isinstance(value, str) and len(value) > MAX_STRING_ATTRIBUTE_LENGTH:
        return f"attribute {name!r}: value longer than {MAX_STRING_ATTRIBUTE_LENGTH} characters"
    return None


def object_name(*parts: str) -> str:
    """A DNS subdomain for an API object made of `parts` ('node-a', 'zero.devplug.io')."""
    name = "-".join(_NOT_LABEL.sub("-", p.lower()).strip("-") for p in parts if p)
    if len(name) <= 253:
        return name
    import hashlib  # only for long names: it loads OpenSSL (~0.7 MiB)

    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('-')}-{digest}"
