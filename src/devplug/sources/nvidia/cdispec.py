"""The CDI spec behind `cdi-annotations` and `cdi-cri`: kind
`k8s.device-plugin.nvidia.com/gpu`, one device per GPU or MIG device, named by its
container ID (UUID or index), as NVIDIA's plugin generates it.

NVIDIA's plugin generates the spec's driver edits itself (nvidia-container-toolkit's
library). devplug takes them from the host's NVIDIA spec (kind `nvidia.com/gpu`, from
`nvidia-ctk cdi generate`, in the folders `nvidia-ctk cdi list` reads) where one exists:
each device gets the edits of the host's device of the same UUID or index, and the
spec the host spec's common edits (driver libraries, hooks). Without one (CDI
strategies alone are then refused: the plugin's start problem), each device gets its
device nodes and the spec the driver's shared nodes (/dev/nvidiactl...), the libraries
coming from the NVIDIA runtime through `envvar`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devplug.config.nvidia import NvidiaSpec
from devplug.framework.cdi import CDI_VERSION, edits_json
from devplug.framework.device import ContainerEdits
from devplug.sources.nvidia.discovery import CDI_KIND, SHARED_NODES, Unit, container_id, host_path

log = logging.getLogger("devplug.sources.nvidia")

HOST_KIND = "nvidia.com/gpu"  # the kind of `nvidia-ctk cdi generate`
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def host_spec(spec: NvidiaSpec) -> tuple[Path, dict[str, Any]] | None:
    """The host's NVIDIA spec (its path and body), or None: the first file of kind
    nvidia.com/gpu in `cdiSpecDirs` (seen under `hostRoot`), devplug's own left out."""
    from devplug.ground import inputs  # JSON is YAML: one parser for both spec formats

    for folder in spec.cdi_spec_dirs:
        path = Path(host_path(spec.host_root, folder))
        try:
            files = sorted(p for p in path.iterdir() if p.suffix in SPEC_SUFFIXES)
        except OSError:
            continue
        for file in files:
            if file.name.startswith("devplug-"):
                continue
            try:
                body = inputs.load_yaml(inputs.read_text(file), str(file), inputs.LARGE_LIMITS)
            except inputs.InputError as error:
                log.warning("CDI spec %s cannot be read: %s", file, error)
                continue
            if isinstance(body, dict) and body.get("kind") == HOST_KIND:
                return file, body
    return None


def _host_devices(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    devices = body.get("devices")
    if not isinstance(devices, list):
        return {}
    return {
        str(d["name"]): d.get("containerEdits") or {}
        for d in devices
        if isinstance(d, dict) and "name" in d
    }


def spec_document(units: Iterable[Unit], spec: NvidiaSpec) -> dict[str, Any]:
    """devplug's spec of these units (the same for every resource of the entry)."""
    host = host_spec(spec)
    by_name = _host_devices(host[1]) if host else {}
    devices: list[dict[str, Any]] = []
    shared: dict[str, Any] = {}
    seen: set[str] = set()
    for unit in units:
        name = container_id(unit, spec)
        if name in seen:
            continue
        seen.add(name)
        index = str(unit.gpu.index) if unit.mig is None else f"{unit.gpu.index}:{unit.mig.slot}"
        edits = by_name.get(unit.uuid) or by_name.get(index)
        if edits is None:  # no host spec, or a device it does not know: the nodes
            own = [n for n in unit.nodes if n.container_path not in SHARED_NODES]
            common = [n for n in unit.nodes if n.container_path in SHARED_NODES]
            edits = edits_json(ContainerEdits(nodes=own))
            for node in edits_json(ContainerEdits(nodes=common)).get("deviceNodes", []):
                shared.setdefault(node["path"], node)
        devices.append({"name": name, "containerEdits": edits})
    body: dict[str, Any] = {
        "cdiVersion": _version(host[1].get("cdiVersion")) if host else CDI_VERSION,
        "kind": CDI_KIND,
        "devices": devices,
    }
    if host and isinstance(host[1].get("containerEdits"), dict):
        body["containerEdits"] = host[1]["containerEdits"]
    elif shared:
        body["containerEdits"] = {"deviceNodes": list(shared.values())}
    return body


def _version(host: object) -> str:
    """The host spec's CDI version when newer than devplug's (its edits may need it),
    else devplug's: each version reads what the older ones wrote."""

    def key(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in text.split("."))
        except ValueError:
            return (0,)

    text = str(host) if host else CDI_VERSION
    return text if key(text) > key(CDI_VERSION) else CDI_VERSION
