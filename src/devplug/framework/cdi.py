"""The CDI (Container Device Interface) format: a device's CDI name, a spec's JSON body
from container edits, and Allocate's answer in each CDI mode (the names' rules are
devplug.kube.cdi's). Shared by the device-plugin path (a spec per resource, see devplug.outputs.cdi)
and by DRA (a spec per prepared claim)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug.config.ids import physical_id
from devplug.framework.device import ContainerEdits, Device, merge_edits
from devplug.ground.files import write_atomic
from devplug.kube.cdi import CdiMode

CDI_VERSION = "0.6.0"
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def device_name(device_id: str) -> str:
    """The CDI device name of a device (its physical ID, made valid): replicas of one
    device share it."""
    name = _NAME_UNSAFE.sub("_", physical_id(device_id)).strip("_.:-")
    return name or "device"


def qualified_name(kind: str, device_id: str) -> str:
    return f"{kind}={device_name(device_id)}"


def edits_json(edits: ContainerEdits) -> dict[str, Any]:
    """A CDI `containerEdits` object: env as NAME=value, device nodes, bind mounts."""
    body: dict[str, Any] = {}
    if edits.env:
        body["env"] = [f"{k}={v}" for k, v in edits.env.items()]
    if edits.nodes:
        body["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
            for n in edits.nodes
        ]
    if edits.mounts:
        body["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in edits.mounts
        ]
    return body


def spec(
    kind: str,
    devices: Mapping[str, ContainerEdits],
    common: ContainerEdits | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A CDI spec of `kind` with one entry per device name (and edits common to all)."""
    body: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind}
    if annotations:
        body["annotations"] = dict(annotations)
    body["devices"] = [
        {"name": name, "containerEdits": edits_json(edits)} for name, edits in devices.items()
    ]
    if common is not None and (common_edits := edits_json(common)):
        body["containerEdits"] = common_edits
    return body


def spec_document(kind: str, devices: Iterable[Device]) -> dict[str, Any]:
    """The CDI spec of `devices`: one entry per physical device (replicas folded) with
    its nodes, mounts and env."""
    entries: dict[str, ContainerEdits] = {}
    for device in devices:
        entries.setdefault(device_name(device.id), merge_edits([device]))
    return spec(kind, entries)


def spec_text(body: Mapping[str, Any]) -> str:
    """A spec as JSON, which every CDI version reads."""
    import json  # only where specs are written: the default daemon does without it

    return json.dumps(body, indent=2) + "\n"


def write_spec(path: Path | str, body: Mapping[str, Any]) -> bool:
    """Write a spec file atomically."""
    return write_atomic(path, spec_text(body))


def spec_file_name(kind: str) -> str:
    return "devplug-" + kind.replace("/", "_") + ".json"


def apply_mode(
    edits: ContainerEdits, devices: Sequence[Device], kind: str, mode: CdiMode
) -> ContainerEdits:
    """Allocate's answer for a CDI `mode`: 'deviceSpecs' leaves `edits` as they are,
    'both' adds the devices' CDI names, 'cdi' adds them and leaves the device nodes and
    mounts to the runtime's CDI injection (env and annotations stay, joined per device)."""
    if mode == "deviceSpecs":
        return edits
    names = dict.fromkeys([*edits.cdi_devices, *(qualified_name(kind, d.id) for d in devices)])
    if mode == "cdi":
        return ContainerEdits(edits.env, [], [], edits.annotations, list(names))
    return ContainerEdits(edits.env, edits.mounts, edits.nodes, edits.annotations, list(names))
