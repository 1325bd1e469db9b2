"""The device manager's checkpoint file, in the kubelet's layout and with its checksum.

The kubelet stores its allocations in `kubelet_internal_checkpoint` as

    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
              "DeviceIDs": {"<numa>": [ids]}, "AllocResp": "<base64>"}],
              "RegisteredDevices": {"<resource>": [ids]}},
     "Checksum": <uint32>}

and checks it with a checksum over the decoded data: FNV-1a (32 bit) of the text that
go-spew prints for the Go value with `%#v` (types in parentheses, strings bare, slices
as `[a b]`, maps as `map[k:v]` with sorted keys, nil as `<nil>`). `_entry_spew` and
`_registered_spew` render that text for the only shape the checkpoint has, so files
written here are accepted by a kubelet and files written by a kubelet are accepted
here. JSON `null` and an empty list differ in that text (`<nil>` and `[]`), so the
decoded form keeps them apart.

`encode` renders a whole checkpoint; `CheckpointWriter` keeps a device manager's,
rewriting the file after every change at the cost of the change.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnv_hash_fast import fnv1a_32

from devplug.ground.files import write_atomic

# NUMA node under which the kubelet files devices that report no topology.
NO_NUMA = -1

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_MASK32 = 0xFFFFFFFF


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


# The state FNV-1a reaches after one byte from its offset basis, by low byte: the
# multiplier is odd, so each of the 256 low bytes is reached by exactly one first byte.
_FNV_FIRST_BYTE = {
    (state := ((_FNV32_OFFSET ^ byte) * _FNV32_PRIME) & _MASK32) & 0xFF: (byte, state)
    for byte in range(256)
}


def _fnv1a32_from(state: int, data: bytes) -> int:
    """FNV-1a of `data` continued from `state` (the hash of what came before), at C speed.

    One FNV-1a step is `h = (h ^ byte) * prime`; the XOR changes the low 8 bits only, so
    over `data` the result is `state * prime**len + c`, where `c` depends on the low 8
    bits of `state` alone. Any state with the same low byte gives the same `c`: the one
    reached from the offset basis by a single first byte, which the library hashes.
    """
    byte, start = _FNV_FIRST_BYTE[state & 0xFF]
    scale = pow(_FNV32_PRIME, len(data), 1 << 32)
    return (fnv1a_32(bytes((byte,)) + data) + (state - start) * scale) & _MASK32


def _spew_strings(values: Sequence[str] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(values) + "]"


def _go_sorted(keys: Iterable[str]) -> list[str]:
    # Go compares strings byte by byte.
    return sorted(keys, key=lambda k: k.encode())


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


# go-spew's `%#v` rendering of the kubelet's checkpointData around its two fields.
_SPEW_ENTRIES = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
_SPEW_REGISTERED = " RegisteredDevices:(map[string][]string)"
_SPEW_END = "}"


def _entry_spew(entry: Entry) -> str:
    """go-spew's rendering of one PodDevicesEntry."""
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
    resp = "<nil>" if entry.alloc_resp is None else "[" + " ".join(map(str, entry.alloc_resp)) + "]"
    return (
        f"{{PodUID:(string){entry.pod_uid} ContainerName:(string){entry.container} "
        f"ResourceName:(string){entry.resource} "
        f"DeviceIDs:(checkpoint.DevicesPerNUMA){numa} AllocResp:([]uint8){resp}}}"
    )


def _entry_json(entry: Entry) -> bytes:
    """encoding/json's rendering of one PodDevicesEntry."""
    return _go_json(
        {
            "PodUID": entry.pod_uid,
            "ContainerName": entry.container,
            "ResourceName": entry.resource,
            "DeviceIDs": None
            if entry.device_ids is None
            else {
                # encoding/json sorts map keys as strings ("-1" < "0" < "10" < "2")
                str(node): None if ids is None else list(ids)
                for node, ids in sorted(entry.device_ids.items(), key=lambda kv: str(kv[0]))
            },
            "AllocResp": None
            if entry.alloc_resp is None
            else base64.b64encode(entry.alloc_resp).decode(),
        }
    ).encode()


def _registered_spew(registered: Mapping[str, Sequence[str] | None] | None) -> str:
    if registered is None:
        return "<nil>"
    return (
        "map["
        + " ".join(f"{k}:{_spew_strings(registered[k])}" for k in _go_sorted(registered))
        + "]"
    )


def _registered_json(registered: Mapping[str, Sequence[str] | None] | None) -> bytes:
    if registered is None:
        return b"null"
    return _go_json(
        {
            k: None if registered[k] is None else list(registered[k] or ())
            for k in _go_sorted(registered)
        }
    ).encode()


def _document(entries_json: bytes | None, registered_json: bytes, checksum_value: int) -> bytes:
    """The file: the entries' JSON objects (joined by commas; None for null), the
    registered devices' JSON object and the checksum, laid out as encoding/json does."""
    entries = b"null" if entries_json is None else b"[" + entries_json + b"]"
    return _JSON_ENTRIES + entries + _json_end(registered_json, checksum_value)


_JSON_ENTRIES = b'{"Data":{"PodDeviceEntries":'


def _json_end(registered_json: bytes, checksum_value: int) -> bytes:
    return b',"RegisteredDevices":' + registered_json + b'},"Checksum":%d}' % checksum_value


def checksum(data: CheckpointData) -> int:
    """The checksum the kubelet computes for `data`."""
    entries = (
        "<nil>"
        if data.entries is None
        else "[" + " ".join(_entry_spew(e) for e in data.entries) + "]"
    )
    text = _SPEW_ENTRIES + entries + _SPEW_REGISTERED + _registered_spew(data.registered)
    return fnv1a_32((text + _SPEW_END).encode())


def encode(data: CheckpointData) -> bytes:
    """The file's bytes, as the kubelet would write them."""
    entries = None if data.entries is None else b",".join(_entry_json(e) for e in data.entries)
    return _document(entries, _registered_json(data.registered), checksum(data))


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
    # As the kubelet writes it: the data synced, the folder not.
    write_atomic(path, encode(data), mode=0o600, sync_folder=False)


@dataclass(frozen=True, slots=True)
class _Rendered:
    entry: Entry
    json: bytes
    spew: str


class CheckpointWriter:
    """One device manager's checkpoint, written after every change with only what changed
    serialized again: the file stays the kubelet's, its cost stays that of the change
    (and of writing the bytes), not of every entry held.

    Entries are kept per pod, container and resource in the order the file lists them:
    pods and their containers as they were added, a container's resources by name. Each
    keeps its JSON and go-spew text. An entry added at the end (a pod being admitted)
    carries the checksum on from the state after the entries before it, and its JSON
    onto the end of the file's bytes, kept from the last write; any other change hashes
    the entries' text again and joins their JSON anew, in one pass each.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pods: dict[str, dict[str, dict[str, _Rendered]]] = {}
        # per pod, its entries' JSON (comma-joined) and go-spew text (space-joined)
        self._pod_json: dict[str, bytes] = {}
        self._pod_spew: dict[str, str] = {}
        self._count = 0
        # FNV-1a state after the go-spew text up to the last entry; None: to be hashed
        self._state: int | None = None
        # the file's bytes up to the end of the last entry; None: to be joined
        self._file: bytearray | None = None
        self._registered: dict[str, list[str]] = {}
        self._registered_json = b""
        self._tail = b""
        self._empty = b""
        self.set_registered({})

    def put(self, entry: Entry) -> None:
        """Add (or replace) the entry of `entry`'s pod, container and resource."""
        rendered = _Rendered(entry, _entry_json(entry), _entry_spew(entry))
        containers = self._pods.get(entry.pod_uid)
        if containers is None:
            containers = self._pods[entry.pod_uid] = {}
            at_end = True
        else:
            at_end = next(reversed(self._pods)) == entry.pod_uid
        resources = containers.get(entry.container)
        if resources is None:
            resources = containers[entry.container] = {}
        else:
            at_end = at_end and next(reversed(containers)) == entry.container
        replaced = entry.resource in resources
        if replaced or (resources and entry.resource < next(reversed(resources))):
            at_end = False
        resources[entry.resource] = rendered
        if not at_end:
            ordered = dict(sorted(resources.items()))
            resources.clear()
            resources.update(ordered)
        self._render_pod(entry.pod_uid)
        if at_end and self._state is not None:
            suffix = rendered.spew if self._count == 0 else " " + rendered.spew
            self._state = _fnv1a32_from(self._state, suffix.encode())
        else:
            self._state = None
        if at_end and self._file is not None:
            self._file += rendered.json if self._count == 0 else b"," + rendered.json
        else:
            self._file = None
        self._count += 0 if replaced else 1

    def remove_pod(self, pod_uid: str) -> bool:
        """Drop the pod's entries; False when it has none."""
        containers = self._pods.pop(pod_uid, None)
        if containers is None:
            return False
        del self._pod_json[pod_uid], self._pod_spew[pod_uid]
        self._count -= sum(len(resources) for resources in containers.values())
        self._state = None
        self._file = None
        return True

    def set_registered(self, registered: Mapping[str, Sequence[str]]) -> None:
        """The healthy devices per registered resource (RegisteredDevices)."""
        self._registered = {k: list(v) for k, v in registered.items()}
        self._registered_json = _registered_json(self._registered)
        end = _SPEW_REGISTERED + _registered_spew(self._registered) + _SPEW_END
        self._tail = ("]" + end).encode()
        self._empty = (_SPEW_ENTRIES + "<nil>" + end).encode()

    def _render_pod(self, pod_uid: str) -> None:
        rendered = [r for c in self._pods[pod_uid].values() for r in c.values()]
        self._pod_json[pod_uid] = b",".join(r.json for r in rendered)
        self._pod_spew[pod_uid] = " ".join(r.spew for r in rendered)

    def data(self) -> CheckpointData:
        entries = [r.entry for c in self._pods.values() for rs in c.values() for r in rs.values()]
        return CheckpointData(entries or None, {k: list(v) for k, v in self._registered.items()})

    def checksum(self) -> int:
        if self._count == 0:
            return fnv1a_32(self._empty)
        if self._state is None:
            text = _SPEW_ENTRIES + "[" + " ".join(self._pod_spew.values())
            self._state = fnv1a_32(text.encode())
        return _fnv1a32_from(self._state, self._tail)

    def _complete(self) -> tuple[bytearray, int]:
        """The file's bytes, and where its entries end (to cut what follows them off
        again once written)."""
        if self._file is None:
            self._file = bytearray(_JSON_ENTRIES + b"[")
            self._file += b",".join(self._pod_json.values())
        end = len(self._file)
        self._file += b"]" + _json_end(self._registered_json, self.checksum())
        return self._file, end

    def encode(self) -> bytes:
        """The file's bytes: those of `encode(self.data())`."""
        if self._count == 0:
            return _document(None, self._registered_json, self.checksum())
        buffer, end = self._complete()
        try:
            return bytes(buffer)
        finally:
            del buffer[end:]

    def write(self) -> None:
        # As the kubelet writes it: the data synced, the folder not.
        if self._count == 0:
            write_atomic(self.path, self.encode(), mode=0o600, sync_folder=False)
            return
        buffer, end = self._complete()
        try:
            write_atomic(self.path, buffer, mode=0o600, sync_folder=False)
        finally:
            del buffer[end:]
