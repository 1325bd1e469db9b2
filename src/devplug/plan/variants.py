"""The knobs devplug controls, applied to a fleet for one run of a capacity question, and
the workload as the pods of that run ask for it.

    --vary topologyPolicy=none,single-numa-node   the kubelet's topology manager
    --vary preferredAllocation=true,false         GetPreferredAllocation offered or not
    --vary replicaPolicy=spread,pack              how time-sliced GPU replicas are picked
    --vary replicas=1,4                           time-slicing (nvidia) / sharing count
    --vary migStrategy=none,single,mixed          how MIG devices are served
    --vary mode=devicePlugin,dra                  counted resources or DRA claims

Each value is one run beside the baseline (the fleet file as it is), one knob at a time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from devplug.config.resource import ResourceSpec
from devplug.fleet.spec import Fleet, Pool
from devplug.plan.workload import GPU, Workload
from devplug.simulator.topology import POLICIES

KNOBS = {
    "topologyPolicy": POLICIES,
    "preferredAllocation": ("true", "false"),
    "replicaPolicy": ("spread", "pack"),
    "migStrategy": ("none", "single", "mixed"),
    "mode": ("devicePlugin", "dra"),
    "replicas": (),  # 1 to 256
}
CLAIM_PREFIX = "claim"


class KnobError(ValueError):
    pass


@dataclass(frozen=True)
class Variant:
    """One run: a name ('baseline', 'replicas=4') and the knob it sets, if any."""

    name: str
    knob: str | None = None
    value: str | None = None


def parse_vary(items: Sequence[str]) -> list[Variant]:
    """The runs of `--vary KNOB=V1,V2` options, the baseline first."""
    variants = [Variant("baseline")]
    for item in items:
        knob, _, values = item.partition("=")
        if knob not in KNOBS:
            raise KnobError(f"--vary {item}: unknown knob {knob!r}: one of {', '.join(KNOBS)}")
        if not values:
            raise KnobError(f"--vary {item}: expected {knob}=VALUE[,VALUE...]")
        for value in values.split(","):
            allowed = KNOBS[knob]
            if knob == "replicas":
                if not value.isdigit() or not 1 <= int(value) <= 256:
                    raise KnobError(f"--vary {item}: replicas: expected 1 to 256, got {value!r}")
            elif value not in allowed:
                raise KnobError(
                    f"--vary {item}: {knob}: expected one of {', '.join(allowed)}, got {value!r}"
                )
            variants.append(Variant(f"{knob}={value}", knob, value))
    return variants


def _resource(spec: ResourceSpec, knob: str, value: str) -> ResourceSpec:
    nvidia = spec.nvidia
    if knob == "preferredAllocation":
        return msgspec.structs.replace(spec, preferred_allocation=value == "true")
    if knob == "mode":
        return msgspec.structs.replace(spec, mode=value)
    if nvidia is None:
        if knob == "replicas":
            return msgspec.structs.replace(spec, count=int(value))
        return spec
    if knob == "replicas":
        nvidia = msgspec.structs.replace(nvidia, replicas=int(value))
    elif knob == "replicaPolicy":
        nvidia = msgspec.structs.replace(nvidia, replica_policy=value)
    elif knob == "migStrategy":
        nvidia = msgspec.structs.replace(nvidia, mig_strategy=value)
    return msgspec.structs.replace(spec, nvidia=nvidia)


def apply(fleet: Fleet, variant: Variant) -> Fleet:
    """The fleet of one run."""
    if variant.knob is None or variant.value is None:
        return fleet
    knob, value = variant.knob, variant.value
    pools = []
    for pool in fleet.pools:
        spec = pool.spec
        config = pool.config
        if knob == "topologyPolicy":
            spec = msgspec.structs.replace(spec, topology_policy=value)
        else:
            resources = [_resource(r, knob, value) for r in config.resources]
            config = msgspec.structs.replace(config, resources=resources)
        pools.append(Pool(spec, config, pool.nodes, pool.where))
    return Fleet(fleet.name, fleet.source, tuple(pools))


@dataclass
class PlannedPod:
    """A pod of one run: its manifest, the devices its claims want per DRA driver, and
    the claims themselves (name in the pod, driver, count) for the run to create."""

    manifest: dict[str, Any]
    claims: dict[str, int] = field(default_factory=dict)
    claim_requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


def _mig_choice(share: float, offers: Mapping[str, float]) -> str | None:
    """The MIG resource with the smallest share of its GPU's memory at least `share`."""
    fitting = [(fraction, name) for name, fraction in offers.items() if fraction >= share]
    return min(fitting)[1] if fitting else None


def mig_offers(hardware: Sequence[Any]) -> dict[str, float]:
    """MIG resources served by device plugin -> their share of the GPU, as NVIDIA's
    profile names give it: '2g.10gb' of a 40 GB GPU is a quarter (the GPU's size from
    the fake driver's model table)."""
    from devplug.fakes.gpumodels import model

    offers: dict[str, float] = {}
    for pool_hardware in hardware:
        for plugin in pool_hardware.device_plugins:
            for device in plugin.devices.values():
                profile, name = device.attributes.get("migProfile"), device.attributes.get("model")
                match = re.search(r"(\d+)gb", str(profile or ""))
                if match is None:
                    continue
                try:
                    whole = round(model(str(name)).memory / 2**30)
                except KeyError:
                    continue
                offers[plugin.resource_name] = int(match[1]) / whole
                break
    return offers


def planned_pods(
    workload: Workload, drivers: Mapping[str, str], offers: Mapping[str, float]
) -> list[PlannedPod]:
    """The workload's pods for one run: GPU shares as MIG devices where `offers` has one
    big enough, and every resource served through DRA (`drivers`: resource -> driver)
    asked for by a claim instead of a count."""
    planned = []
    for manifest in workload.pods:
        pod = msgspec.json.decode(msgspec.json.encode(manifest))
        share = workload.shares.get(pod["metadata"]["name"])
        claims: dict[str, int] = {}
        pod_claims: list[dict[str, Any]] = []
        for container in pod["spec"].get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            if share and GPU in limits and (choice := _mig_choice(share, offers)):
                limits[choice] = limits.pop(GPU)
            for resource in [r for r in limits if r in drivers]:
                count = int(limits.pop(resource))
                driver = drivers[resource]
                name = f"{CLAIM_PREFIX}{len(pod_claims)}"
                pod_claims.append({"name": name, "driver": driver, "count": count})
                claims[driver] = claims.get(driver, 0) + count
                container.setdefault("resources", {}).setdefault("claims", []).append(
                    {"name": name}
                )
        if pod_claims:
            pod["spec"]["resourceClaims"] = [
                {"name": c["name"], "resourceClaimName": f"{pod['metadata']['name']}-{c['name']}"}
                for c in pod_claims
            ]
        planned.append(PlannedPod(pod, claims, pod_claims))
    return planned
