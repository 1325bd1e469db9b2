"""The DRA node plugin of the real daemon, driven by the simulator's kubelet DRA path
(claims given as documents in a folder): registration through the plugin watcher,
prepare with per-claim CDI specs, idempotence, unprepare, restarts, health, bad RPCs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devplug.api.dra.v1beta1 import api_pb2 as drapb
from devplug.api.dra.v1beta1 import api_pb2_grpc as dragrpc
from devplug.api.drahealth.v1alpha1 import api_pb2 as healthpb
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as healthgrpc
from devplug.api.pluginregistration.v1 import api_pb2 as regpb
from devplug.api.pluginregistration.v1 import api_pb2_grpc as reggrpc
from devplug.framework.debug import DEBUG_STATE_ENV
from devplug.ground.channel import unix_channel
from devplug.simulator.report import node_text
from devplug.simulator.results import REASON_FAILED_PREPARE, REASON_UNSCHEDULABLE
from tests.dra_helpers import (
    DRIVER,
    Daemon,
    NodeDirs,
    accelerator_config,
    allocated_claim,
    claim_pod,
    first_result,
    kubelet_for,
    kubelet_process,
    serve_command,
    serving,
    write_claim,
)
from tests.hw_helpers import validate_cdi
from tests.serve_helpers import free_port, http_get, wait_for_path

MODELS = {"acc0": "u250", "acc1": "u280"}
CDI_KIND = f"{DRIVER}/claim"
# A daemon's start on a busy machine.
REGISTERED_S = 60
STATE = "state.json"  # the daemon's state dump, in its folder


@pytest.fixture
def dirs(short_tmp: Path) -> NodeDirs:
    return NodeDirs(short_tmp)


async def test_pod_with_a_claim_gets_the_cdi_device_of_its_allocation(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "claim-u280", "uid-1", ["acc1"])

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
        try:
            await kubelet.wait_for_registration(DRIVER, timeout=REGISTERED_S)
            assert kubelet.dra is not None
            assert kubelet.dra.drivers[DRIVER].version == "v1.DRAPlugin"
            [result] = await kubelet.apply(claim_pod("p1", "claim-u280"))
            assert result.admitted, result.message
            assert result.containers[0].options.cdi_devices == [f"{CDI_KIND}=uid-1-acc1"]
            spec = json.loads((dirs.cdi / f"{DRIVER}-uid-1.json").read_text())
            validate_cdi(spec)
            assert spec["kind"] == CDI_KIND
            [device] = spec["devices"]
            assert device["name"] == "uid-1-acc1"
            nodes = device["containerEdits"]["deviceNodes"]
            assert [n["hostPath"] for n in nodes] == [str(dirs.dev / "acc1")]
            assert "DEVPLUG_EXAMPLE_COM_ACC=acc1" in spec["containerEdits"]["env"]
            status = kubelet.node_status()
            assert status.dra_drivers == {DRIVER: "v1.DRAPlugin"}
            [prepared] = status.dra_claims
            assert (prepared.name, prepared.uid) == ("claim-u280", "uid-1")
            assert prepared.cdi_devices == {DRIVER: [f"{CDI_KIND}=uid-1-acc1"]}
            text = node_text(status)
            assert "DRA DRIVER" in text
            assert f"default/claim-u280  {CDI_KIND}=uid-1-acc1" in text

            # Idempotent: the same claim again gives the same answer.
            async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
                stub = dragrpc.DRAPluginStub(channel)
                claim = drapb.Claim(namespace="default", uid="uid-1", name="claim-u280")
                request = drapb.NodePrepareResourcesRequest(claims=[claim])
                first = await stub.NodePrepareResources(request, timeout=10)
                second = await stub.NodePrepareResources(request, timeout=10)
                assert first == second
                [answer] = first.claims["uid-1"].devices
                assert (answer.pool_name, answer.device_name) == ("node-a", "acc1")
                assert list(answer.request_names) == ["acc"]

                # A claim without a UID is refused with INVALID_ARGUMENT; serving goes on.
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.NodePrepareResources(
                        drapb.NodePrepareResourcesRequest(
                            claims=[drapb.Claim(namespace="default", name="x")]
                        ),
                        timeout=10,
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert await stub.NodePrepareResources(request, timeout=10) == first

            # Kubelet restart: the driver registers again, the pod keeps its devices.
            seen = kubelet.registrations(DRIVER)
            await kubelet.restart()
            await kubelet.wait_for_registration(DRIVER, after=seen, timeout=REGISTERED_S)
            pod = kubelet.pod("p1")
            assert pod is not None
            assert pod.containers[0].options.cdi_devices == [f"{CDI_KIND}=uid-1-acc1"]

            # Driver restart: the prepared claim survives in its checkpoint.
            assert daemon.stop() == 0
            seen = kubelet.registrations(DRIVER)
            daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
            await kubelet.wait_for_registration(DRIVER, after=seen, timeout=REGISTERED_S)
            checkpoint = dirs.plugins / DRIVER / "prepared-claims.json"
            assert "uid-1" in json.loads(checkpoint.read_text())["claims"]
            # The claim can no longer be read: the restarted driver answers from
            # its checkpoint.
            (dirs.claims / "claim-u280.yaml").unlink()
            async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
                again = await dragrpc.DRAPluginStub(channel).NodePrepareResources(
                    request, timeout=10
                )
            assert again == first

            # Deleting the pod unprepares the claim: CDI spec and checkpoint entry go.
            assert await kubelet.delete_pod("p1")
            assert not (dirs.cdi / f"{DRIVER}-uid-1.json").exists()
            assert json.loads(checkpoint.read_text())["claims"] == {}
        finally:
            daemon.stop()


async def test_a_claim_for_a_device_the_node_lacks_is_refused(dirs: NodeDirs) -> None:
    """The simulator, standing in for the scheduler, refuses an allocation of a device
    no slice lists; the driver, asked all the same, refuses to prepare it."""
    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "claim-x", "uid-2", ["acc9"])

    async with serving(dirs, config) as kubelet:
        [result] = await kubelet.apply(claim_pod("p2", "claim-x"))
        assert not result.admitted
        assert result.reason == REASON_UNSCHEDULABLE
        assert result.message == (
            f"claim default/claim-x: device acc9 of driver {DRIVER} is in no "
            "ResourceSlice of pool node-a"
        )
        async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
            claim = drapb.Claim(namespace="default", uid="uid-2", name="claim-x")
            answer = await dragrpc.DRAPluginStub(channel).NodePrepareResources(
                drapb.NodePrepareResourcesRequest(claims=[claim]), timeout=10
            )
        assert answer.claims["uid-2"].error == "device acc9 is not published by this node"


async def test_health_stream_reports_a_device_that_went_away(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)

    async with serving(dirs, config) as kubelet:
        # The kubelet calls the health service only when GetInfo lists it.
        async with unix_channel(dirs.registry / f"{DRIVER}-reg.sock") as channel:
            info = await reggrpc.RegistrationStub(channel).GetInfo(regpb.InfoRequest())
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        async with unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel:
            stub = healthgrpc.DRAResourceHealthStub(channel)
            stream = stub.NodeWatchResources(healthpb.NodeWatchResourcesRequest())
            first = await stream.read()
            health = {d.device.device_name: d.health for d in first.devices}
            assert health == {"acc0": healthpb.HEALTHY, "acc1": healthpb.HEALTHY}
            (dirs.dev / "acc0").unlink()
            second = await stream.read()
            health = {d.device.device_name: d.health for d in second.devices}
            assert health == {"acc0": healthpb.UNHEALTHY, "acc1": healthpb.HEALTHY}
            assert {d.device.pool_name for d in second.devices} == {"node-a"}
            stream.cancel()
        # The simulated kubelet follows the same stream (v1).
        dra = kubelet.dra
        assert dra is not None
        await kubelet.wait_for(
            lambda: dra.device_health.get((DRIVER, "node-a", "acc0")) == "Unhealthy",
            what="acc0 unhealthy in the kubelet",
        )
        assert dra.device_health[(DRIVER, "node-a", "acc1")] == "Healthy"


def test_kubelet_command_prepares_claims_from_a_folder(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "claim-u250", "uid-3", ["acc0"])
    pods = dirs.root / "pods.yaml"
    pods.write_text(yaml.safe_dump(claim_pod("p3", "claim-u250")))
    daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
    kubelet = kubelet_process(
        dirs, "--claims-dir", str(dirs.claims), "--wait-for", DRIVER, "-f", str(pods)
    )
    try:
        result = first_result(kubelet)
        assert result["admitted"], result
        assert result["options"]["cdi_devices"] == [f"{CDI_KIND}=uid-3-acc0"]
    finally:
        kubelet.terminate()
        kubelet.wait(timeout=15)
        daemon.stop()


async def test_claims_that_cannot_be_prepared_get_an_error_each(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "claim-ok", "uid-ok", ["acc0"])
    pending = allocated_claim("claim-pending", "uid-p", [])
    del pending["status"]
    (dirs.claims / "claim-pending.yaml").write_text(yaml.safe_dump(pending))

    async with (
        serving(dirs, config),
        unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel,
    ):
        stub = dragrpc.DRAPluginStub(channel)
        claims = [
            drapb.Claim(namespace="default", uid="uid-other", name="claim-ok"),
            drapb.Claim(namespace="default", uid="uid-p", name="claim-pending"),
            drapb.Claim(namespace="default", uid="uid-m", name="claim-missing"),
            drapb.Claim(namespace="default", uid="uid-ok", name="claim-ok"),
        ]
        answer = await stub.NodePrepareResources(
            drapb.NodePrepareResourcesRequest(claims=claims), timeout=10
        )
        errors = {uid: entry.error for uid, entry in answer.claims.items()}
        assert errors["uid-other"] == (
            "ResourceClaim default/claim-ok has UID uid-ok, not uid-other"
        )
        assert errors["uid-p"] == "ResourceClaim default/claim-pending is not allocated"
        assert "claim-missing not found" in errors["uid-m"]
        assert errors["uid-ok"] == ""
        assert [d.device_name for d in answer.claims["uid-ok"].devices] == ["acc0"]
        # Unprepare of a claim never prepared succeeds (a restart in between).
        undone = await stub.NodeUnprepareResources(
            drapb.NodeUnprepareResourcesRequest(claims=claims[2:]), timeout=10
        )
        assert {u: e.error for u, e in undone.claims.items()} == {
            "uid-m": "",
            "uid-ok": "",
        }
        assert not (dirs.cdi / f"{DRIVER}-uid-ok.json").exists()


@pytest.fixture
def unreachable_api(dirs: NodeDirs, daemons: list[Any]) -> tuple[subprocess.Popen[str], int]:
    """The daemon serving with a kubeconfig whose API server is unreachable, its stderr
    piped, its state dumped to STATE in its folder on SIGUSR1; and its metrics port."""
    config = accelerator_config(dirs, MODELS)
    kubeconfig = dirs.root / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    port = free_port()
    command = serve_command(dirs, config, "--metrics-port", str(port), kubeconfig=str(kubeconfig))
    env = {**os.environ, DEBUG_STATE_ENV: str(dirs.root / STATE)}
    daemons.append(daemon := subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env))
    return daemon, port


def slices_failed(daemon: subprocess.Popen[str]) -> str:
    """The daemon's first line saying its slices could not be published (blocking)."""
    assert daemon.stderr is not None
    lines = iter(daemon.stderr.readline, "")
    return next(line for line in lines if "publishing slices failed" in line)


async def test_node_plugin_serves_while_the_api_server_is_unreachable(
    dirs: NodeDirs, unreachable_api: tuple[subprocess.Popen[str], int]
) -> None:
    """Slices that cannot be published are retried; the kubelet side works meanwhile."""
    daemon, port = unreachable_api
    async with kubelet_for(dirs) as kubelet:
        await kubelet.wait_for_registration(DRIVER, timeout=REGISTERED_S)
        failed = await asyncio.to_thread(slices_failed, daemon)
        assert "retrying in" in failed
        assert daemon.poll() is None
        # Registered with the kubelet, but not ready: the slices are not published.
        status, body = await asyncio.to_thread(http_get, port, "/readyz")
        assert (status, body) == (
            503,
            f"{DRIVER}: ResourceSlices not listed from the API server yet\n",
        )


async def test_the_dra_daemon_talks_to_the_api_server_without_the_kubernetes_package(
    dirs: NodeDirs, unreachable_api: tuple[subprocess.Popen[str], int]
) -> None:
    """Slices, claims and their status go through devplug's own client: the official
    client, the larger by far, is not even imported (`make bench`, key `dra`: the RSS)."""
    daemon, _ = unreachable_api
    await asyncio.to_thread(slices_failed, daemon)  # the publisher has tried by now
    daemon.send_signal(signal.SIGUSR1)
    await asyncio.to_thread(wait_for_path, dirs.root / STATE)
    modules = set(json.loads((dirs.root / STATE).read_text())["modules"])
    assert {"aiohttp", "devplug.apiserver.client", "devplug.apiserver.informer"} <= modules
    assert not [m for m in modules if m.partition(".")[0] == "kubernetes"]


async def test_readyz_waits_for_the_kubelet_to_register_the_driver(
    dirs: NodeDirs, daemons: list[Any]
) -> None:
    """Before any kubelet has registered the driver, /readyz says so (503); once one has
    and the slices are published, it answers 200."""
    from tests.serve_helpers import wait_for_log

    config = accelerator_config(dirs, MODELS)
    port = free_port()
    log = dirs.root / "daemon.log"
    daemons.append(Daemon(serve_command(dirs, config, "--metrics-port", str(port)), log))
    await asyncio.to_thread(wait_for_log, log, "serving /metrics, /healthz and /readyz")
    status, body = await asyncio.to_thread(http_get, port, "/readyz")
    # The slices may or may not be published yet; the kubelet's registration is not.
    assert status == 503
    assert f"{DRIVER}: not registered with the kubelet" in body.splitlines()

    async with kubelet_for(dirs) as kubelet:
        await kubelet.wait_for_registration(DRIVER, timeout=REGISTERED_S)
        await asyncio.to_thread(wait_for_log, log, f"{DRIVER}: registered with the kubelet")
        assert await asyncio.to_thread(http_get, port, "/readyz") == (200, "ok\n")


async def test_a_spec_that_cannot_be_written_fails_the_claim(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "claim-ok", "uid-ok", ["acc0"])

    async with serving(dirs, config) as kubelet:
        # A file where the CDI folder should be, made after the start (serve refuses
        # to start with one).
        if dirs.cdi.is_dir():
            dirs.cdi.rmdir()
        dirs.cdi.write_text("a file where the CDI folder should be")
        [result] = await kubelet.apply(claim_pod("p4", "claim-ok"))
        assert not result.admitted
        assert result.reason == REASON_FAILED_PREPARE
        assert "cannot prepare" in result.message
        # The driver keeps serving: the same claim works once the folder is there.
        dirs.cdi.unlink()
        [result] = await kubelet.apply(claim_pod("p4", "claim-ok"))
        assert result.admitted, result.message


async def test_a_tainted_device_goes_only_to_a_claim_that_tolerates_it(dirs: NodeDirs) -> None:
    """With claims from a folder the simulator stands in for the scheduler: a device the
    driver publishes tainted (its node gone) is refused to a claim whose request does not
    tolerate the taint, and prepared for one that does."""
    from tests.serve_helpers import wait_for_log

    config = accelerator_config(dirs, MODELS)
    write_claim(dirs, "plain", "uid-plain", ["acc0"])
    tolerant = allocated_claim("tolerant", "uid-tolerant", ["acc0"])
    toleration = {"key": "devplug.io/unhealthy", "operator": "Exists"}
    tolerant["status"]["allocation"]["devices"]["results"][0]["tolerations"] = [toleration]
    (dirs.claims / "tolerant.yaml").write_text(yaml.safe_dump(tolerant))

    async with serving(dirs, config) as kubelet:
        (dirs.dev / "acc0").unlink()
        # The second publish: the slice documents now carry the taint.
        await asyncio.to_thread(wait_for_log, dirs.root / "daemon.log", "published", 2)
        [refused] = await kubelet.apply(claim_pod("p-plain", "plain"))
        assert refused.reason == REASON_UNSCHEDULABLE
        assert refused.message == (
            "claim default/plain: device acc0 has the taint "
            "devplug.io/unhealthy=device-node-missing:NoSchedule, which the claim does "
            "not tolerate"
        )
        [allowed] = await kubelet.apply(claim_pod("p-tolerant", "tolerant"))
        assert allowed.admitted, allowed.message
        assert allowed.containers[0].options.cdi_devices == [f"{CDI_KIND}=uid-tolerant-acc0"]
