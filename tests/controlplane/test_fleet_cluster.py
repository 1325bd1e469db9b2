"""`devplug fleet` against a real control plane (etcd, kube-apiserver, kube-scheduler):
nodes registered with what their plugins serve, kept fresh, pods bound by the real
scheduler admitted or failed with the kubelet's reasons, devices freed on deletion, DRA
claims prepared, an API server outage survived, and `down` removing exactly what `up`
made. Skipped, saying how to provide them, where the control-plane binaries are absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.apiserver.client import KubeApi
from devplug.fleet.runner import FleetError, FleetRunner, Options, remove_fleet
from devplug.fleet.spec import parse_fleet
from tests.fleet_helpers import WAIT_S, Fleets, made, until

ACC = "example.com/acc"


def fleet_of(name: str, *pools: dict[str, Any]) -> Any:
    return parse_fleet(yaml.safe_dump({"name": name, "pools": list(pools)}), f"{name}.yaml")


def acc_pool(name: str, count: int = 1, devices: int = 4, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "count": count,
        "cpu": "4",
        "memory": "8Gi",
        "labels": {"example.com/tier": "test"},
        "taints": [{"key": "example.com/dedicated", "value": name, "effect": "NoSchedule"}],
        "config": {"resources": [{"name": ACC, "virtual": devices}]},
        **more,
    }


def pod(name: str, pool: str, limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"devplug.io/fleet-pool": pool},
            "tolerations": [{"key": "example.com/dedicated", "operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "resources": {"limits": limits}}
            ],
            **spec,
        },
    }


async def namespace(api: KubeApi) -> str:
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    return name


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


@pytest.fixture
def api(fleets: Fleets) -> KubeApi:
    """The fleet's own client of the test run's API server."""
    return fleets.api


@pytest.fixture
def kubeconfig_settings(kubeconfig: str) -> dict[str, Any]:
    """The test run's kubeconfig, as YAML says it."""
    settings: dict[str, Any] = yaml.safe_load(Path(kubeconfig).read_text())
    return settings


# -- registration ---------------------------------------------------------------------------


async def test_up_registers_nodes_with_their_devices_and_keeps_them_fresh(
    api: KubeApi, fleets: Fleets
) -> None:
    dra = {"name": "example.com/dracc", "mode": "dra", "virtual": 2}
    pool = acc_pool("reg", count=2)
    pool["config"]["resources"].append(dra)
    runner = await fleets.start(fleet_of("reg", pool))

    listed = await api.call(
        "GET", "/api/v1/nodes", params={"labelSelector": "devplug.io/fleet=reg"}
    )
    nodes = listed["items"]
    first = await api.call(
        "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/reg-0"
    )
    renewed = await until(
        api,
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        lambda leases: (
            "reg-0" in leases and leases["reg-0"]["spec"]["renewTime"] != first["spec"]["renewTime"]
        ),
    )
    lease = renewed["reg-0"]
    slices = await api.call(
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices",
        params={"labelSelector": "devplug.io/fleet=reg"},
    )

    assert sorted(n["metadata"]["name"] for n in nodes) == ["reg-0", "reg-1"]
    node = next(n for n in nodes if n["metadata"]["name"] == "reg-0")
    assert node["status"]["capacity"] == {"cpu": "4", "memory": "8Gi", "pods": "110", ACC: "4"}
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert node["spec"]["taints"] == [
        {"key": "example.com/dedicated", "value": "reg", "effect": "NoSchedule"}
    ]  # the not-ready taint of admission is gone
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert node["metadata"]["labels"]["example.com/tier"] == "test"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "reg-0"
    assert lease["spec"]["holderIdentity"] == "reg-0"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert sorted((s["spec"]["nodeName"], len(s["spec"]["devices"])) for s in slices["items"]) == [
        ("reg-0", 2),
        ("reg-1", 2),
    ]
    assert {s["spec"]["driver"] for s in slices["items"]} == {"dracc.example.com"}
    assert runner.counters.lease_renewals >= 1


# -- pods ---------------------------------------------------------------------------------


async def test_pods_the_scheduler_binds_run_fail_with_the_kubelets_reason_and_free_devices(
    api: KubeApi, fleets: Fleets
) -> None:
    gpus = {
        "name": "gpu",
        "count": 1,
        "gpus": {"count": 1},
        "config": {"resources": [{"nvidia": {"replicas": 2, "failRequestsGreaterThanOne": True}}]},
    }
    gpu = "nvidia.com/gpu"
    runner = await fleets.start(fleet_of("pods", gpus))
    ns = await namespace(api)
    pods = f"/api/v1/namespaces/{ns}/pods"
    no_taint: dict[str, Any] = {"tolerations": []}

    await api.call("POST", pods, pod("greedy", "gpu", {gpu: 2}, **no_taint))
    failed = await until(api, pods, lambda p: phase(p.get("greedy", {})) == "Failed")
    for name in ("a", "b", "c"):
        await api.call("POST", pods, pod(name, "gpu", {gpu: 1}, **no_taint))
    seen = await until(
        api,
        pods,
        lambda p: (
            sum(phase(p.get(n, {})) == "Running" for n in "abc") == 2
            and any(
                c.get("reason") == "Unschedulable"
                for n in "abc"
                for c in (p.get(n, {}).get("status") or {}).get("conditions") or []
            )
        ),
    )
    waiting = next(n for n in "abc" if phase(seen[n]) != "Running")
    first = next(n for n in "abc" if n != waiting)
    node = runner.nodes["gpu-0"]
    before = node.devices_in_use(gpu)
    await api.call("DELETE", f"{pods}/{first}")
    after = await until(
        api, pods, lambda p: first not in p and phase(p.get(waiting, {})) == "Running"
    )
    now = node.devices_in_use(gpu)
    events = await api.call("GET", f"/api/v1/namespaces/{ns}/events")

    greedy = failed["greedy"]
    assert greedy["status"]["reason"] == "UnexpectedAdmissionError"
    assert greedy["status"]["message"].startswith(
        "Pod was rejected: Allocate failed due to rpc error: code = InvalidArgument desc = "
        "2 replicas of nvidia.com/gpu requested by one container"
    )
    assert sorted(n for n, p in after.items() if phase(p) == "Running") == sorted(
        set("abc") - {next(n for n in "abc" if n not in after)}
    )
    running_pod = next(p for p in after.values() if phase(p) == "Running")
    statuses = running_pod["status"]["containerStatuses"]
    assert [(s["name"], s["ready"], "running" in s["state"]) for s in statuses] == [
        ("main", True, True)
    ]
    assert (before, now) == (2, 2)
    [event] = [
        e
        for e in events["items"]
        if e["involvedObject"]["name"] == "greedy" and e["source"].get("component") == "kubelet"
    ]
    assert (event["reason"], event["type"], event["source"]["host"]) == (
        "UnexpectedAdmissionError",
        "Warning",
        "gpu-0",
    )


async def test_a_dra_claim_the_scheduler_allocates_is_prepared_on_the_node(
    api: KubeApi, fleets: Fleets
) -> None:
    driver = f"acc-{uuid.uuid4().hex[:6]}.example.com"
    resource = {"name": "example.com/acc", "mode": "dra", "virtual": 2, "dra": {"driver": driver}}
    selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
    await fleets.enter(
        made(
            api,
            "/apis/resource.k8s.io/v1/deviceclasses",
            {"metadata": {"name": driver}, "spec": {"selectors": [selector]}},
        )
    )
    runner = await fleets.start(fleet_of("dra", acc_pool("dra", config={"resources": [resource]})))
    ns = await namespace(api)
    claim = {
        "metadata": {"name": "one"},
        "spec": {
            "devices": {"requests": [{"name": "acc", "exactly": {"deviceClassName": driver}}]}
        },
    }
    made_claim = await api.call(
        "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim
    )
    body = pod("user", "dra", {})
    body["spec"]["resourceClaims"] = [{"name": "acc", "resourceClaimName": "one"}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "acc"}]}
    pods = f"/api/v1/namespaces/{ns}/pods"
    await api.call("POST", pods, body)
    seen = await until(api, pods, lambda p: phase(p.get("user", {})) == "Running")
    preparer = runner.nodes["dra-0"].preparers[driver]
    prepared = dict(preparer.prepared)
    await api.call("DELETE", f"{pods}/user")
    await until(api, pods, lambda p: "user" not in p)
    await runner.wait_for(lambda: not preparer.prepared)

    uid = made_claim["metadata"]["uid"]
    assert seen["user"]["spec"]["nodeName"] == "dra-0"
    assert list(prepared) == [uid]
    [device] = prepared[uid].devices
    assert (device.pool, device.device_id) in {("dra-0", "acc-0"), ("dra-0", "acc-1")}


# -- bad days --------------------------------------------------------------------------------


class Proxy:
    """A TCP relay to the API server that a test can cut and restore, as a network
    partition between the fleet and its API server; cut when its context ends."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def __aenter__(self) -> Proxy:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.cut()

    def stall(self) -> None:
        """Keep the connections open but pass nothing on: requests hang unanswered."""
        self._flowing.clear()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._open -= {writer, up_writer}


class Relayed:
    """A client of the API server through a relay the test can cut."""

    def __init__(self, proxy: Proxy, api: KubeApi) -> None:
        self.proxy = proxy
        self.api = api


@pytest.fixture
async def relayed(fleets: Fleets, kubeconfig_settings: dict[str, Any], tmp_path: Path) -> Relayed:
    """A client through a `Proxy`, for a fleet: closed, and the relay cut, after the
    fleets the test starts."""
    settings = copy.deepcopy(kubeconfig_settings)
    cluster = settings["clusters"][0]["cluster"]
    proxy = await fleets.enter(Proxy(int(cluster["server"].rsplit(":", 1)[1])))
    cluster["server"] = f"https://127.0.0.1:{proxy.port}"
    path = tmp_path / "relayed.kubeconfig"
    path.write_text(yaml.safe_dump(settings))
    return Relayed(proxy, await fleets.enter(KubeApi.from_kubeconfig(str(path))))


async def test_an_api_server_outage_loses_no_allocation(
    api: KubeApi, fleets: Fleets, relayed: Relayed
) -> None:
    """The fleet's connection is cut while pods are deleted and bound behind its back;
    once it is back, the pods it held keep their devices, the deleted one's are free,
    and the new pod gets one nobody holds."""
    runner = await fleets.start(fleet_of("outage", acc_pool("out", devices=3)), relayed.api)
    node = runner.nodes["out-0"]
    ns = await namespace(api)
    pods = f"/api/v1/namespaces/{ns}/pods"
    for name in ("keep", "gone"):
        await api.call("POST", pods, pod(name, "out", {ACC: 1}))
    await until(
        api, pods, lambda p: all(phase(p.get(n, {})) == "Running" for n in ("keep", "gone"))
    )

    def holders() -> dict[str, list[str]]:
        names = {uid: held.name for uid, held in node.held.items()}
        return {
            names[uid]: containers["main"][ACC].ids()
            for uid, containers in node.manager.pod_devices.items()
        }

    before = holders()
    failures = runner.counters.lease_failures
    await relayed.proxy.cut()
    await runner.wait_for(lambda: runner.counters.lease_failures > failures)
    await api.call("DELETE", f"{pods}/gone", {"gracePeriodSeconds": 0, "kind": "DeleteOptions"})
    await api.call("POST", pods, pod("new", "out", {ACC: 1}))
    await until(api, pods, lambda p: p.get("new", {}).get("spec", {}).get("nodeName"))
    away = holders()
    await relayed.proxy.start()  # the same port again
    await until(api, pods, lambda p: phase(p.get("new", {})) == "Running")
    await runner.wait_for(lambda: set(holders()) == {"keep", "new"})
    after = holders()

    assert set(before) == {"keep", "gone"}
    assert away == before  # nothing is lost, nor invented, while the server is away
    assert after["keep"] == before["keep"]
    assert after["new"] != before["keep"]


async def test_down_removes_what_up_made_and_up_refuses_a_node_it_does_not_own(
    api: KubeApi, fleets: Fleets, tmp_path: Path
) -> None:
    fleet = fleet_of("tidy", acc_pool("tidy", count=2))
    bystander = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tidy-bystander"}}
    # A node of a fleet node's name that someone else made: `up` must not take it over.
    squatter = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tidy-1"}}
    await fleets.enter(made(api, "/api/v1/nodes", bystander))
    runner = await fleets.start(fleet, serve=False)
    listed = await api.call(
        "GET", "/api/v1/nodes", params={"labelSelector": "devplug.io/fleet=tidy"}
    )
    removed = await remove_fleet(api, "tidy")
    await fleets.stop(runner)
    left = await api.call("GET", "/api/v1/nodes")
    leases = await api.call(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        params={"labelSelector": "devplug.io/fleet=tidy"},
    )
    await fleets.enter(made(api, "/api/v1/nodes", squatter))
    with pytest.raises(FleetError) as refused:
        await fleets.start(fleet, folder=tmp_path / "again", serve=False)
    after = await api.call("GET", "/api/v1/nodes")

    assert len(listed["items"]) == 2
    assert removed == {"nodes": 2, "leases": 2, "resourceslices": 0, "events": 0}
    names = {n["metadata"]["name"] for n in left["items"]}
    assert "tidy-bystander" in names
    assert not {"tidy-0", "tidy-1"} & names
    assert leases["items"] == []
    assert str(refused.value) == (
        "node 'tidy-1' exists and is not part of fleet 'tidy': nothing was changed"
    )
    assert "tidy-0" not in {n["metadata"]["name"] for n in after["items"]}


class Renewing(FleetRunner):
    """A fleet that says when it starts renewing a lease."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.renewing = asyncio.Event()

    async def _renew(self, name: str) -> None:
        self.renewing.set()
        await super()._renew(name)


async def test_renewals_in_flight_end_with_the_fleet(fleets: Fleets, relayed: Relayed) -> None:
    """The API server stops answering while leases are renewed: stopping the fleet ends
    the renewals in flight with it, none left to fail once its session is closed."""
    only_leases = Options(renew_s=0.3, status_report_s=3600.0)
    runner = await fleets.start(
        fleet_of("stall", acc_pool("stall", count=3)), relayed.api, only_leases, Renewing
    )
    assert isinstance(runner, Renewing)
    relayed.proxy.stall()
    runner.renewing.clear()
    await asyncio.wait_for(runner.renewing.wait(), WAIT_S)  # one that hangs
    await fleets.stop(runner)

    others = asyncio.all_tasks() - {asyncio.current_task()}  # not this test's
    assert [t for t in others if "_renew" in repr(t.get_coro())] == []
