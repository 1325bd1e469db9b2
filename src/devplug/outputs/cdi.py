"""CDI spec files: container edits in the Container Device Interface format that
containerd (>= 1.7) and CRI-O (>= 1.23) read from /etc/cdi and /var/run/cdi.

A spec holds devices of one kind (`vendor.com/class`); a runtime asked for the CDI
device `vendor.com/class=name` applies that device's edits and the spec's common
ones to the container.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.framework.device import ContainerEdits
from devplug.outputs.files import write_atomic

CDI_VERSION = "0.5.0"


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
    """A CDI spec of `kind` with one entry per device name."""
    body: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind}
    if annotations:
        body["annotations"] = dict(annotations)
    body["devices"] = [
        {"name": name, "containerEdits": edits_json(edits)} for name, edits in devices.items()
    ]
    if common is not None and (common_edits := edits_json(common)):
        body["containerEdits"] = common_edits
    return body


def qualified_name(kind: str, name: str) -> str:
    """'example.com/gpu', 'gpu0' -> 'example.com/gpu=gpu0'."""
    return f"{kind}={name}"


def write_spec(path: Path | str, body: Mapping[str, Any]) -> bool:
    """Write a spec file atomically (JSON, which every CDI version reads)."""
    return write_atomic(path, json.dumps(body, indent=2) + "\n")
