"""The device manager's checkpoint file, in the kubelet's layout and with its checksum.

The kubelet stores its allocations in `kubelet_internal_checkpoint` as

    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
              "DeviceIDs": {"<numa>": [ids]}, "AllocResp": "<base64>"}],
              "RegisteredDevices": {"<resource>": [ids]}},
     "Checksum": <uint32>}

and checks it with a checksum over the decoded data: FNV-1a (32 bit) of the text that
go-spew prints for the Go value with `%#v` (types in parentheses, strings bare, slices
as `[a b]`, maps as `map[k:v]` with sorted keys, nil as `<nil>`). `_spew` renders that
text for the only shape the checkpoint has, so files written here are accepted by a
kubelet and files written by a kubelet are accepted here. JSON `null` and an empty
list differ in that text (`<nil>` and `[]`), so the decoded form keeps them apart.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.outputs.files import write_atomic

# NUMA node under which the kubelet files devices that report no topology.
NO_NUMA = -1

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


class CheckpointError(Exception):
    """The checkpoint file cannot be used (unreadable, not JSON, wrong shape, bad checksum)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """The devices of one resource held by one container, and the plugin's answer for them."""

    pod_uid: str
    container: str
    resource: str
    # NUMA node (NO_NUMA for none) -> device IDs; None stands for JSON null.
    device_ids: Mapping[int, Sequence[str] | None] | None
    # The serialized ContainerAllocateResponse; None stands for JSON null.
    alloc_resp: bytes | None

    def all_ids(self) -> list[str]:
        """Every device ID of the entry once, in NUMA order."""
        seen: dict[str, None] = {}
        numa = self.device_ids or {}
        for node in sorted(numa):
            for device_id in numa[node] or ():
                seen[device_id] = None
        return list(seen)


@dataclass(frozen=True, slots=True)
class CheckpointData:
    entries: Sequence[Entry] | None
    # resource -> IDs of its healthy devices when the checkpoint was written
    registered: Mapping[str, Sequence[str] | None] | None


def _fnv1a32(data: bytes, value: int = _FNV32_OFFSET) -> int:
    for byte in data:
        value = ((value ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return value


# FNV-1a is a running hash, and the checkpoint is written after every change with
# mostly the same entries in the same order: remembering the state after each
# (state, entry) step makes a write cost the changed entries, not the whole file.
_FNV_STEPS: dict[tuple[int, str], int] = {}
_FNV_STEPS_MAX = 50_000


def _fnv1a32_chunks(chunks: Sequence[str]) -> int:
    value = _FNV32_OFFSET
    if len(_FNV_STEPS) > _FNV_STEPS_MAX:
        _FNV_STEPS.clear()
    for chunk in chunks:
        key = (value, chunk)
        step = _FNV_STEPS.get(key)
        if step is None:
            step = _FNV_STEPS[key] = _fnv1a32(chunk.encode(), value)
        value = step
    return value


def _spew_strings(values: Sequence[str] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(values) + "]"


def _go_sorted(keys: Sequence[str]) -> list[str]:
    # Go compares strings byte by byte.
    return sorted(keys, key=lambda k: k.encode())


def _spew(data: CheckpointData) -> list[str]:
    """go-spew's rendering of the kubelet's checkpoint struct, in pieces (one per entry)."""
    parts = ["(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"]
    if data.entries is None:
        parts.append("<nil>")
    else:
        rendered = []
        for entry in data.entries:
            if entry.device_ids is None:
                numa = "<nil>"
            else:
                numa = (
                    "map["
                    + " ".join(
                        f"{node}:{_spew_strings(entry.device_ids[node])}"
                        for node in sorted(entry.device_ids)
                    )
                    + "]"
                )
            resp = (
                "<nil>"
                if entry.alloc_resp is None
                else "[" + " ".join(map(str, entry.alloc_resp)) + "]"
            )
            rendered.append(
                f"{{PodUID:(string){entry.pod_uid} ContainerName:(string){entry.container} "
                f"ResourceName:(string){entry.resource} "
                f"DeviceIDs:(checkpoint.DevicesPerNUMA){numa} AllocResp:([]uint8){resp}}}"
            )
        parts.append("[")
        parts.extend(r if i == 0 else " " + r for i, r in enumerate(rendered))
        parts.append("]")
    parts.append(" RegisteredDevices:(map[string][]string)")
    if data.registered is None:
        parts.append("<nil>")
    else:
        registered = data.registered
        parts.append(
            "map["
            + " ".join(f"{k}:{_spew_strings(registered[k])}" for k in _go_sorted(list(registered)))
            + "]"
        )
    parts.append("}")
    return parts


def checksum(data: CheckpointData) -> int:
    """The checksum the kubelet computes for `data`."""
    return _fnv1a32_chunks(_spew(data))


def _go_json(value: Any) -> str:
    # encoding/json output: compact, UTF-8, with <, >, &, U+2028 and U+2029 escaped.
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def encode(data: CheckpointData) -> bytes:
    """The file's bytes, as the kubelet would write them."""
    entries: list[dict[str, Any]] | None = None
    if data.entries is not None:
        entries = [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container,
                "ResourceName": e.resource,
                "DeviceIDs": None
                if e.device_ids is None
                else {
                    # encoding/json sorts map keys as strings ("-1" < "0" < "10" < "2")
                    str(node): None if ids is None else list(ids)
                    for node, ids in sorted(e.device_ids.items(), key=lambda kv: str(kv[0]))
                },
                "AllocResp": None
                if e.alloc_resp is None
                else base64.b64encode(e.alloc_resp).decode(),
            }
            for e in data.entries
        ]
    registered = (
        None
        if data.registered is None
        else {
            k: None if data.registered[k] is None else list(data.registered[k] or ())
            for k in _go_sorted(list(data.registered))
        }
    )
    document = {
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered},
        "Checksum": checksum(data),
    }
    return _go_json(document).encode()


def _strings(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{where}: expected a list of strings")
    return value


def decode(blob: bytes) -> CheckpointData:
    """Parse and verify a checkpoint; CheckpointError says what is wrong with it."""
    try:
        document = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise CheckpointError("not a JSON object")
    body = document.get("Data")
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise CheckpointError("Data: expected an object")
    raw_entries = body.get("PodDeviceEntries")
    entries: list[Entry] | None = None
    if raw_entries is not None:
        if not isinstance(raw_entries, list):
            raise CheckpointError("PodDeviceEntries: expected a list")
        entries = [_decode_entry(i, raw) for i, raw in enumerate(raw_entries)]
    raw_registered = body.get("RegisteredDevices")
    registered: dict[str, list[str] | None] | None = None
    if raw_registered is not None:
        if not isinstance(raw_registered, dict):
            raise CheckpointError("RegisteredDevices: expected an object")
        registered = {
            k: _strings(v, f"RegisteredDevices[{k!r}]") for k, v in raw_registered.items()
        }
    data = CheckpointData(entries, registered)
    stored = document.get("Checksum")
    if not isinstance(stored, int) or isinstance(stored, bool):
        raise CheckpointError("Checksum: expected an unsigned integer")
    if stored != checksum(data):
        raise CheckpointError(
            f"checkpoint is corrupted: checksum {stored} does not match its data ({checksum(data)})"
        )
    return data


def _decode_entry(index: int, raw: Any) -> Entry:
    where = f"PodDeviceEntries[{index}]"
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: expected an object")
    texts = {}
    for key in ("PodUID", "ContainerName", "ResourceName"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise CheckpointError(f"{where}.{key}: expected a string")
        texts[key] = value
    raw_ids = raw.get("DeviceIDs")
    device_ids: dict[int, list[str] | None] | None = None
    if raw_ids is not None:
        if not isinstance(raw_ids, dict):
            # A list here is the layout of Kubernetes <= 1.19, without NUMA nodes.
            raise CheckpointError(f"{where}.DeviceIDs: expected an object of NUMA node -> IDs")
        device_ids = {}
        for node, ids in raw_ids.items():
            try:
                numa = int(node)
            except ValueError:
                raise CheckpointError(
                    f"{where}.DeviceIDs: NUMA node {node!r} is no integer"
                ) from None
            device_ids[numa] = _strings(ids, f"{where}.DeviceIDs[{node}]")
    raw_resp = raw.get("AllocResp")
    alloc_resp: bytes | None = None
    if raw_resp is not None:
        if not isinstance(raw_resp, str):
            raise CheckpointError(f"{where}.AllocResp: expected a base64 string")
        try:
            alloc_resp = base64.b64decode(raw_resp, validate=True)
        except binascii.Error as error:
            raise CheckpointError(f"{where}.AllocResp: {error}") from None
    return Entry(
        texts["PodUID"], texts["ContainerName"], texts["ResourceName"], device_ids, alloc_resp
    )


def read(path: Path) -> CheckpointData | None:
    """The checkpoint at `path`; None when there is none; CheckpointError when unusable."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    return decode(blob)


def write(path: Path, data: CheckpointData) -> None:
    write_atomic(path, encode(data), mode=0o600)
