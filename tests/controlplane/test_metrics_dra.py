"""The DRA metrics of a real `devplug serve`: claims prepared and unprepared by result
and their durations, slice publications, claim status writes and health transitions,
every series there at 0 from the start; scraped and read with prometheus-client's parser.

The daemon runs with `--log-level debug`: each of these events is a debug line, written
after the metrics have counted it, so a test waits for the line, never for time.
"""

from __future__ import annotations

import asyncio
import platform
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.api.dra.v1 import api_pb2 as drapb
from devplug.api.dra.v1 import api_pb2_grpc as dragrpc
from devplug.ground.channel import unix_channel
from tests.dra_helpers import (
    DRIVER,
    NODE,
    RESOURCE,
    Daemon,
    NodeDirs,
    accelerator_config,
    allocated_claim,
    kubelet_for,
    serve_command,
)
from tests.metrics_helpers import scrape, value
from tests.serve_helpers import free_port, wait_for_log

MODELS = {"acc0": "u250", "acc1": "u280"}
SERVING = "serving /metrics, /healthz and /readyz"
API_WAIT_S = 60.0
CLAIM_FAMILIES = (
    "devplug_dra_prepare_claims_total",
    "devplug_dra_unprepare_claims_total",
    "devplug_dra_prepare_claim_duration_seconds_count",
    "devplug_dra_unprepare_claim_duration_seconds_count",
    "devplug_dra_slice_publishes_total",
    "devplug_dra_claim_status_writes_total",
)


@pytest.fixture
def dirs(short_tmp: Path) -> NodeDirs:
    return NodeDirs(short_tmp)


def debug_daemon(dirs: NodeDirs, command: list[str], port: int) -> Daemon:
    """The daemon of `command` (from serve_command) with debug logs and metrics on."""
    main = command.index("serve")
    full = [*command[:main], "--log-level", "debug", *command[main:]]
    return Daemon([*full, "--metrics-port", str(port)], dirs.root / "daemon.log")


def claims(*names: str) -> list[drapb.Claim]:
    return [drapb.Claim(namespace="default", name=n, uid=f"uid-{n}") for n in names]


async def prepare(dirs: NodeDirs, refs: list[drapb.Claim]) -> dict[str, str]:
    """NodePrepareResources of `refs` on the daemon's dra.sock: uid -> error."""
    async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
        answer = await dragrpc.DRAPluginStub(channel).NodePrepareResources(
            drapb.NodePrepareResourcesRequest(claims=refs), timeout=10
        )
    return {uid: entry.error for uid, entry in answer.claims.items()}


async def unprepare(dirs: NodeDirs, refs: list[drapb.Claim]) -> dict[str, str]:
    async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
        answer = await dragrpc.DRAPluginStub(channel).NodeUnprepareResources(
            drapb.NodeUnprepareResourcesRequest(claims=refs), timeout=10
        )
    return {uid: entry.error for uid, entry in answer.claims.items()}


async def test_claims_are_counted_by_result_from_zero_with_their_durations(
    dirs: NodeDirs, daemons: list[Any]
) -> None:
    config = accelerator_config(dirs, MODELS)
    dirs.claims.mkdir(exist_ok=True)
    for name, device in (("ok", "acc0"), ("other", "acc1")):
        claim = allocated_claim(name, f"uid-{name}", [device])
        (dirs.claims / f"{name}.yaml").write_text(yaml.safe_dump(claim))
    port = free_port()
    log = dirs.root / "daemon.log"
    daemons.append(debug_daemon(dirs, serve_command(dirs, config), port))

    async with kubelet_for(dirs) as kubelet:
        await kubelet.wait_for_registration(DRIVER)
        await asyncio.to_thread(wait_for_log, log, SERVING)
        before = await asyncio.to_thread(scrape, port)
        # Every series of the driver, at 0 before its first claim.
        for family in CLAIM_FAMILIES[:-2]:
            for result in ("ok", "error"):
                assert value(before, family, driver=DRIVER, result=result) == 0
        assert (
            value(before, "devplug_dra_claim_status_writes_total", driver=DRIVER, result="ok") == 0
        )
        assert (
            value(before, "devplug_dra_slice_publishes_total", driver=DRIVER, result="error") == 0
        )
        # Written to the claims folder before the driver registered.
        assert value(before, "devplug_dra_slice_publishes_total", driver=DRIVER, result="ok") >= 1
        for before_health, after_health in (("Healthy", "Unhealthy"), ("Unhealthy", "Healthy")):
            labels = {"resource": RESOURCE, "from": before_health, "to": after_health}
            assert value(before, "devplug_health_transitions_total", **labels) == 0
        build = value(
            before,
            "devplug_build_info",
            version=build_version(before),
            python=platform.python_version(),
        )
        assert build == 1

        errors = await prepare(dirs, claims("ok", "missing"))
        assert errors["uid-ok"] == ""
        assert "missing not found" in errors["uid-missing"]
        await asyncio.to_thread(wait_for_log, log, "claim default/missing not prepared")
        assert await unprepare(dirs, claims("ok")) == {"uid-ok": ""}
        await asyncio.to_thread(wait_for_log, log, "claim default/ok unprepared")
        after = await asyncio.to_thread(scrape, port)
        expected = {
            ("devplug_dra_prepare_claims_total", "ok"): 1,
            ("devplug_dra_prepare_claims_total", "error"): 1,
            ("devplug_dra_prepare_claim_duration_seconds_count", "ok"): 1,
            ("devplug_dra_prepare_claim_duration_seconds_count", "error"): 1,
            ("devplug_dra_unprepare_claims_total", "ok"): 1,
            ("devplug_dra_unprepare_claims_total", "error"): 0,
        }
        for (family, result), count in expected.items():
            assert value(after, family, driver=DRIVER, result=result) == count, family
        seconds = value(
            after, "devplug_dra_prepare_claim_duration_seconds_sum", driver=DRIVER, result="ok"
        )
        assert 0 < seconds < 10

        # A device node goes: one Healthy -> Unhealthy transition, one more publish.
        published = after[
            (
                "devplug_dra_slice_publishes_total",
                frozenset({"driver": DRIVER, "result": "ok"}.items()),
            )
        ]
        (dirs.dev / "acc1").unlink()
        await asyncio.to_thread(wait_for_log, log, "devices now unhealthy: acc1")
        await asyncio.to_thread(wait_for_log, log, "slices published", int(published) + 1)
        sick = await asyncio.to_thread(scrape, port)
        labels = {"resource": RESOURCE, "from": "Healthy", "to": "Unhealthy"}
        assert value(sick, "devplug_health_transitions_total", **labels) == 1
        assert (
            value(sick, "devplug_dra_slice_publishes_total", driver=DRIVER, result="ok")
            == published + 1
        )


def build_version(samples: Any) -> str:
    """The version label of the one devplug_build_info sample."""
    [labels] = [dict(k[1]) for k in samples if k[0] == "devplug_build_info"]
    assert labels["version"]
    return str(labels["version"])


def test_slices_that_cannot_be_published_are_counted_as_errors(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)
    kubeconfig = dirs.root / "kubeconfig"
    kubeconfig.write_text(unreachable_kubeconfig())
    port = free_port()
    log = dirs.root / "daemon.log"
    daemon = debug_daemon(dirs, serve_command(dirs, config, kubeconfig=str(kubeconfig)), port)
    try:
        # Slower with a Kubernetes client to import, on a busy machine.
        wait_for_log(log, SERVING, timeout=API_WAIT_S)
        wait_for_log(log, "publishing slices failed", timeout=API_WAIT_S)
        samples = scrape(port)
        failed = value(samples, "devplug_dra_slice_publishes_total", driver=DRIVER, result="error")
        assert failed >= 1
        assert value(samples, "devplug_dra_slice_publishes_total", driver=DRIVER, result="ok") == 0
    finally:
        daemon.stop()


def unreachable_kubeconfig() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


@pytest.mark.timeout(240)
async def test_claim_status_writes_are_counted_against_a_real_api_server(
    kubeconfig: str, api: Any, dirs: NodeDirs
) -> None:
    """A claim allocated on the API server, prepared through dra.sock: its device status
    written (ok); unprepared: its entries cleared (ok)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    namespace = f"m-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    name = "metered"
    body = allocated_claim(name, "", ["acc0"], namespace=namespace)
    status = body.pop("status")
    body["metadata"].pop("uid")
    body["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": DRIVER}
    made = resource.create_namespaced_resource_claim(namespace, body)
    # A node of its own: the slices published here are not those other tests of this
    # control plane look for.
    node = "node-metrics"
    status["allocation"]["devices"]["results"][0]["pool"] = node
    status["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    resource.patch_namespaced_resource_claim_status(name, namespace, {"status": status})
    config = accelerator_config(dirs, MODELS)
    port = free_port()
    log = dirs.root / "daemon.log"
    command = serve_command(dirs, config, kubeconfig=kubeconfig)
    command[command.index(NODE)] = node
    daemon = debug_daemon(dirs, command, port)
    uid = made.metadata.uid
    ref = [drapb.Claim(namespace=namespace, name=name, uid=uid)]
    writes = "devplug_dra_claim_status_writes_total"

    written = f"status of claim {namespace}/{name} written"
    try:
        async with kubelet_for(dirs) as kubelet:
            # Slower with a Kubernetes client to import, on a busy machine.
            await kubelet.wait_for_registration(DRIVER, timeout=API_WAIT_S)
            assert await prepare(dirs, ref) == {uid: ""}
            await asyncio.to_thread(wait_for_log, log, written, 1, API_WAIT_S)
            devices = resource.read_namespaced_resource_claim(name, namespace).status.devices
            assert [(d.driver, d.device) for d in devices] == [(DRIVER, "acc0")]
            samples = await asyncio.to_thread(scrape, port)
            assert value(samples, writes, driver=DRIVER, result="ok") == 1
            assert value(samples, writes, driver=DRIVER, result="error") == 0
            assert await unprepare(dirs, ref) == {uid: ""}
            await asyncio.to_thread(wait_for_log, log, written, 2, API_WAIT_S)
            samples = await asyncio.to_thread(scrape, port)
            assert value(samples, writes, driver=DRIVER, result="ok") == 2
            assert not resource.read_namespaced_resource_claim(name, namespace).status.devices
    finally:  # the daemon stopped first: it would restore the slices of its node
        daemon.stop()
        resource.patch_namespaced_resource_claim_status(
            name, namespace, {"status": {"allocation": None, "devices": None}}
        )
        resource.delete_namespaced_resource_claim(name, namespace)
        resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
