"""Device metadata for containers (KEP-5304, beta in Kubernetes 1.37): each container of
a claim finds a file that describes the devices of each of its requests (driver, pool,
name, attributes as the slices publish them), at a path it can know from its pod spec,
under /var/run/kubernetes.io/dra-device-attributes:

    resourceclaims/<claim>/<request>/<driver>-metadata.json
    resourceclaimtemplates/<pod claim>/<request>/<driver>-metadata.json

(the second for a claim made from a template: its own name is generated, the pod's name
for it is not). The file is a JSON stream of the same DeviceMetadata once per version
devplug writes, newest first (metadata.resource.k8s.io/v1alpha1 today), so a reader
takes the first version it knows. It lives in the driver's folder on the host and is
bind-mounted read-only through a device of the claim's CDI spec; no feature gate: the
driver opts in, the runtime needs CDI.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug.framework.device import Mount

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
# Where the API server notes the pod's name of a claim made from a template.
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
HOST_DIR = "dra-device-metadata"
# Newest first.
VERSIONS = ("metadata.resource.k8s.io/v1alpha1",)


def base_request(request: str) -> str:
    """'gpu/large' (a subrequest of a firstAvailable request) -> 'gpu'."""
    return request.partition("/")[0]


def container_path(driver: str, claim: Mapping[str, Any], request: str) -> str:
    meta = claim.get("metadata") or {}
    pod_claim = (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
    if pod_claim:
        folder = f"resourceclaimtemplates/{pod_claim}"
    else:
        folder = f"resourceclaims/{meta['name']}"
    return f"{CONTAINER_DIR}/{folder}/{request}/{driver}-metadata.json"


def claim_dir(state_dir: Path, namespace: str, name: str) -> Path:
    return state_dir / HOST_DIR / f"{namespace}_{name}"


def document(
    driver: str,
    claim: Mapping[str, Any],
    requests: Mapping[str, Sequence[Mapping[str, Any]]],
) -> bytes:
    """The file of one base request: `requests` maps each full request name to its
    devices ({pool, name, attributes})."""
    meta = claim.get("metadata") or {}
    body: dict[str, Any] = {
        "kind": "DeviceMetadata",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": 1,
        },
    }
    if pod_claim := (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION):
        body["podClaimName"] = pod_claim
    body["requests"] = [
        {"name": name, "devices": [{"driver": driver, **device} for device in devices]}
        for name, devices in requests.items()
    ]
    return b"".join(
        json.dumps({"apiVersion": version, **body}, separators=(",", ":")).encode() + b"\n"
        for version in VERSIONS
    )


def write(
    state_dir: Path,
    driver: str,
    claim: Mapping[str, Any],
    devices: Sequence[tuple[str, Mapping[str, Any]]],
) -> dict[str, Mount]:
    """Write the files of a claim's requests (`devices`: (full request name, device)),
    and answer the bind mount of each base request."""
    from devplug.ground.files import write_atomic

    meta = claim.get("metadata") or {}
    folder = claim_dir(state_dir, meta["namespace"], meta["name"])
    grouped: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for request, device in devices:
        grouped.setdefault(base_request(request), {}).setdefault(request, []).append(device)
    mounts = {}
    for base, requests in grouped.items():
        host = folder / base / "metadata.json"
        # Not synced to disk (as upstream's helper writes it): a reboot takes the
        # claim's CDI spec in /var/run/cdi with it, and the kubelet's prepare then
        # writes both again; each fsync would cost prepare milliseconds.
        write_atomic(host, document(driver, claim, requests), durable=False)
        mounts[base] = Mount(str(host), container_path(driver, claim, base), read_only=True)
    return mounts


def remove(state_dir: Path, namespace: str, name: str) -> None:
    shutil.rmtree(claim_dir(state_dir, namespace, name), ignore_errors=True)
