"""A DRA fleet end to end, as `bench/fleet.py --dra` runs it at 1,000 nodes: fleet nodes
publish ResourceSlices of their GPUs, the real resourceclaim controller
(kube-controller-manager) makes each pod's claim from a ResourceClaimTemplate, the
real kube-scheduler (its client rate raised) allocates the claim and binds the pod, the
node the pod is bound to prepares the claim and reports the pod Running; and the
metrics the benchmark reads are there. Skipped, saying how to provide them, where the
control-plane binaries are absent.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fleet.runner import Options
from devplug.fleet.spec import parse_fleet
from devplug.testing.components import (
    Component,
    claim_controller_summary,
    client_summary,
    controller_manager_binary,
    parse_metrics,
    scheduler_summary,
)
from devplug.testing.controlplane import how_to_provide
from tests.fleet_helpers import Fleets, made, until

ROOT = Path(__file__).resolve().parents[2]
NODES = 20
GPUS = 2  # per node: 40 pods take every GPU of the fleet, each once
PODS = NODES * GPUS
QPS = 500
WAIT_S = 180.0  # forty pods through four processes on a busy machine


class Parts:
    def __init__(self, scheduler: Component, claims: Component, name: str) -> None:
        self.scheduler = scheduler
        self.claims = claims
        self.name = name


@pytest.fixture
def parts(kubeconfig: str, tmp_path: Path) -> Iterator[Parts]:
    """A scheduler of the test's own (client rate raised) and the resourceclaim
    controller, both real processes against the control plane."""
    bin_dir = ROOT / ".envtest" / "bin"
    manager = controller_manager_binary(ROOT, bin_dir)
    if manager is None:
        pytest.skip(how_to_provide(ROOT) + " (and kube-controller-manager.xz beside them)")
    name = f"dra-scale-{uuid.uuid4().hex[:6]}"
    scheduler = Component.scheduler(tmp_path / "scheduler", kubeconfig, bin_dir, name, QPS)
    claims = Component.claim_controller(tmp_path / "kcm", manager, kubeconfig, QPS)
    try:
        scheduler.wait_ready()
        claims.wait_ready()
        yield Parts(scheduler, claims, name)
    finally:
        claims.stop()
        scheduler.stop()


def fleet_of(name: str, driver: str) -> Any:
    pool = {
        "name": "gpu",
        "count": NODES,
        "namePrefix": f"{name}-",
        "gpus": {"model": "H100-SXM5-80GB", "count": GPUS},
        "config": {"resources": [{"nvidia": {}, "mode": "dra", "dra": {"driver": driver}}]},
    }
    return parse_fleet(yaml.safe_dump({"name": name, "pools": [pool]}), f"{name}.yaml")


def gpu_pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def running(pod: dict[str, Any]) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Running")


async def test_every_claim_from_a_template_is_allocated_by_the_scheduler_and_prepared_on_its_node(
    fleets: Fleets, parts: Parts, tmp_path: Path
) -> None:
    name = parts.name
    driver = f"gpu-{name}.devplug.io"
    resource = "/apis/resource.k8s.io/v1"
    api = fleets.api
    selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
    await fleets.enter(
        made(
            api,
            f"{resource}/deviceclasses",
            {"metadata": {"name": driver}, "spec": {"selectors": [selector]}},
        )
    )
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    request = {"name": "gpu", "exactly": {"deviceClassName": driver}}
    template = {"devices": {"requests": [request]}}
    await api.call(
        "POST",
        f"{resource}/namespaces/{name}/resourceclaimtemplates",
        {"metadata": {"name": "one-gpu"}, "spec": {"spec": template}},
    )
    runner = await fleets.start(
        fleet_of(name, driver), options=Options(), folder=tmp_path / "fleet"
    )
    slices = await until(
        api,
        f"{resource}/resourceslices",
        lambda found: len({s["spec"]["nodeName"] for s in found.values()}) == NODES,
        WAIT_S,
        {"fieldSelector": f"spec.driver={driver}"},
    )
    pods = f"/api/v1/namespaces/{name}/pods"
    for index in range(PODS):
        await api.call("POST", pods, gpu_pod(f"p{index}", name))
    bound = await until(api, pods, lambda found: sum(map(running, found.values())) == PODS, WAIT_S)
    claims = await api.call("GET", f"{resource}/namespaces/{name}/resourceclaims")
    prepared = {
        node: dict(found.preparers[driver].prepared)
        for node, found in runner.nodes.items()
        if driver in found.preparers
    }
    await api.call("DELETE", pods, params={"gracePeriodSeconds": "0"})
    await fleets.stop(runner)
    by_name = {c["metadata"]["name"]: c for c in claims["items"]}

    # Every node published its GPUs, in a pool of its own name.
    published: dict[str, set[str]] = {}
    for found in slices.values():
        spec = found["spec"]
        assert spec["pool"]["name"] == spec["nodeName"]
        published.setdefault(spec["nodeName"], set()).update(d["name"] for d in spec["devices"])
    assert set(published) == {f"{name}-{i}" for i in range(NODES)}
    assert all(len(devices) == GPUS for devices in published.values())

    # Every pod Running on a fleet node, its claim made from the template for it,
    # allocated by the scheduler to a device its node published, reserved for it,
    # and prepared by that node with that device.
    taken = set()
    for pod in bound.values():
        node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
        [entry] = pod["status"]["resourceClaimStatuses"]
        claim = by_name[entry["resourceClaimName"]]
        owner = claim["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("Pod", uid)
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (driver, node)
        assert result["device"] in published[node]
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [uid]
        [device] = prepared[node][claim["metadata"]["uid"]].devices
        assert (device.pool, device.device) == (node, result["device"])
        taken.add((node, result["device"]))
    assert len(bound) == PODS
    assert len(taken) == PODS  # no GPU given twice: every GPU of the fleet, once
    assert runner.counters.admitted == PODS
    assert runner.counters.claims_prepared == PODS

    # What the benchmark reads beside its own figures.
    scheduler = scheduler_summary(parse_metrics(parts.scheduler.metrics()), name)
    assert scheduler["scheduled"] == PODS
    assert scheduler["sli_pods"] >= PODS
    assert scheduler["sli_mean_ms"] > 0
    assert scheduler["attempt_mean_ms"] > 0
    assert scheduler["dra_plugin"]["PreFilter"]["evaluations"] >= PODS
    assert scheduler["dra_plugin"]["Filter"]["evaluations"] >= PODS
    client = client_summary(parse_metrics(parts.scheduler.metrics()))
    assert client["requests"]["PUT"] >= PODS  # the claims' allocations
    assert client["rate_limiter_wait_s"] is not None
    created = claim_controller_summary(parse_metrics(parts.claims.metrics()))
    assert created["creates_total{admin_access=false,status=success}"] == PODS
