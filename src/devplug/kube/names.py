"""The names Kubernetes accepts, by the API machinery's validation rules: DNS labels
(RFC 1123: namespaces, container names, DRA device names), DNS subdomains (object
names, domains of resource and label names), the name part of a qualified name
(resource and label names after the '/'), label values, extended resource names and
label names. Written once for the config, the simulator, the fleet, DRA and the
node-feature file."""

from __future__ import annotations

import re

MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
MAX_QUALIFIED_NAME_PART = 63
MAX_LABEL_VALUE = 63

# Compiled on first use (re keeps them), not at every start.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_QUALIFIED_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_VALUE_UNSAFE = r"[^A-Za-z0-9_.-]+"


def is_dns_label(name: str) -> bool:
    """At most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit."""
    return len(name) <= MAX_DNS_LABEL and re.fullmatch(_DNS1123_LABEL, name) is not None


def is_dns_subdomain(name: str, max_length: int = MAX_DNS_SUBDOMAIN) -> bool:
    """DNS labels joined by '.', at most `max_length` in all (253 unless a field says
    less, as DRA driver names do)."""
    return len(name) <= max_length and re.fullmatch(_DNS1123_SUBDOMAIN, name) is not None


def is_qualified_name_part(name: str) -> bool:
    """The name of a qualified name (after the optional 'prefix/'): 1-63 of
    [A-Za-z0-9-_.], starting and ending with a letter or digit."""
    if len(name) > MAX_QUALIFIED_NAME_PART:
        return False
    return re.fullmatch(_QUALIFIED_NAME_PART, name) is not None


def is_label_value(value: str) -> bool:
    """Empty, or what a qualified name's part may be."""
    return not value or is_qualified_name_part(value)


def label_value(text: str) -> str:
    """`text` as a valid label value: other characters become '-', at most 63, starting
    and ending with a letter or digit ('Alveo U280 ' -> 'Alveo-U280')."""
    return re.sub(_VALUE_UNSAFE, "-", text)[:MAX_LABEL_VALUE].strip("-_.")


_NATIVE_NAMESPACE = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."


def resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name, or None when it is: the
    kubelet's own check, so that a name devplug accepts is never refused at
    registration, and the simulator refuses exactly what the kubelet refuses."""
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


def label_name_problem(name: str) -> str | None:
    """Why `name` is not a label key ('example.com/fpga.count'), or None: NFD drops
    such a label, so it is left out (a long resource name plus '.numa-nodes' can pass
    the 63 characters of the part after '/')."""
    prefix, slash, short = name.rpartition("/")
    if not is_qualified_name_part(short) or (slash and not is_dns_subdomain(prefix)):
        return (
            f"{name!r} is not a label name: 1-63 characters of [A-Za-z0-9-_.] after an "
            "optional DNS prefix and '/', starting and ending with a letter or digit"
        )
    return None
