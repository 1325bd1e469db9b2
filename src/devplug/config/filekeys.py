"""The keys of NVIDIA's config file matched as NVIDIA's plugin matches them.

NVIDIA's plugin turns its YAML into JSON and decodes that with Go's encoding/json:
a struct's keys match their field case-insensitively (an exact match preferred) and
keys it does not know are dropped without a word. The sharing lists
(`sharing.timeSlicing`, `sharing.mps` and their `resources` entries) and the entries
of `resources.gpus`/`resources.mig` are decoded by hand from a map, so there a key
matches only as spelled. devplug keeps those rules and says what it drops: `match`
returns the data with NVIDIA's spelling and the dotted paths of the keys ignored.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

import msgspec

# Structs NVIDIA decodes from a map by exact key (custom UnmarshalJSON).
_EXACT: set[str] = {"Shared", "Replicated"}


def _struct_in(annotation: Any) -> type[msgspec.Struct] | None:
    """The Struct class an annotation holds (`X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    for arg in typing.get_args(annotation):
        found = _struct_in(arg)
        if found is not None:
            return found
    return None


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(arg) for arg in typing.get_args(annotation))


@functools.cache
def _fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A struct's fields by the key that names them (resolving the annotations once)."""
    return {f.encode_name: f for f in msgspec.structs.fields(struct)}


def match(data: Any, struct: type[msgspec.Struct], at: str, ignored: list[str]) -> Any:
    """`data` (a decoded mapping for `struct`) with each key spelled as the field it
    matches; keys that match none are left out and named in `ignored`."""
    if not isinstance(data, dict):
        return data  # msgspec names the wrong shape
    exact = struct.__name__ in _EXACT
    fields = _fields(struct)
    folded = {name.casefold(): name for name in fields}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            ignored.append(f"{at}{key!r}")
            continue
        name = key if key in fields else None if exact else folded.get(key.casefold())
        if name is None:
            ignored.append(at + key)
            continue
        inner = _struct_in(fields[name].type)
        if inner is not None:
            path = f"{at}{name}"
            if _is_list(fields[name].type) and isinstance(value, list):
                value = [match(v, inner, f"{path}[{i}].", ignored) for i, v in enumerate(value)]
            else:
                value = match(value, inner, path + ".", ignored)
        out[name] = value  # a later key of the same field wins, as in Go
    return out
