"""The names Kubernetes accepts, by the API machinery's validation rules: DNS labels
(RFC 1123: namespaces, container names, DRA device names), DNS subdomains (object
names, domains of resource and label names), the name part of a qualified name
(resource and label names after the '/'), and label values. Written once for the
config, the simulator, the fleet, DRA and the node-feature file."""

from __future__ import annotations

import re

MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
MAX_QUALIFIED_NAME_PART = 63
MAX_LABEL_VALUE = 63

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def is_dns_label(name: str) -> bool:
    """At most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit."""
    return len(name) <= MAX_DNS_LABEL and _DNS1123_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str, max_length: int = MAX_DNS_SUBDOMAIN) -> bool:
    """DNS labels joined by '.', at most `max_length` in all (253 unless a field says
    less, as DRA driver names do)."""
    return len(name) <= max_length and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_qualified_name_part(name: str) -> bool:
    """The name of a qualified name (after the optional 'prefix/'): 1-63 of
    [A-Za-z0-9-_.], starting and ending with a letter or digit."""
    return len(name) <= MAX_QUALIFIED_NAME_PART and _QUALIFIED_NAME_PART.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """Empty, or what a qualified name's part may be."""
    return not value or is_qualified_name_part(value)


def label_value(text: str) -> str:
    """`text` as a valid label value: other characters become '-', at most 63, starting
    and ending with a letter or digit ('Alveo U280 ' -> 'Alveo-U280')."""
    return _VALUE_UNSAFE.sub("-", text)[:MAX_LABEL_VALUE].strip("-_.")
