"""Kubernetes 1.37 and 1.38 on the node: the v1 device health service beside v1alpha1,
the standard NUMA attribute, the names and selectors 1.38 accepts, registration sockets
within the AF_UNIX limit."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from devplug.api.drahealth.v1 import api_pb2 as health_v1
from devplug.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug.ground.channel import unix_channel
from tests.dra_helpers import DRIVER, NodeDirs, accelerator_config, serving

MODELS = {"acc0": "u250", "acc1": "u280"}
HEALTH = [(health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)]


@pytest.fixture
def dirs(short_tmp: Path) -> NodeDirs:
    return NodeDirs(short_tmp)


async def test_both_health_versions_stream_the_same_devices_with_the_message(
    dirs: NodeDirs,
) -> None:
    config = accelerator_config(dirs, MODELS)

    async with (
        serving(dirs, config) as kubelet,
        unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel,
    ):
        streams = [
            (
                pb,
                grpc_pb.DRAResourceHealthStub(channel).NodeWatchResources(
                    pb.NodeWatchResourcesRequest()
                ),
            )
            for pb, grpc_pb in HEALTH
        ]

        async def read(pb: ModuleType, stream: object) -> dict[str, tuple[str, str]]:
            message = await stream.read()  # type: ignore[attr-defined]
            return {
                d.device.device_name: (pb.HealthStatus.Name(d.health), d.message)
                for d in message.devices
            }

        for pb, stream in streams:
            assert await read(pb, stream) == {"acc0": ("HEALTHY", ""), "acc1": ("HEALTHY", "")}
        (dirs.dev / "acc0").unlink()
        seen = [await read(pb, stream) for pb, stream in streams]
        assert seen[0] == seen[1]
        state, message = seen[0]["acc0"]
        assert state == "UNHEALTHY", seen
        assert message, seen
        assert seen[0]["acc1"] == ("HEALTHY", "")
        for _, stream in streams:
            stream.cancel()  # type: ignore[attr-defined]
        # The simulated kubelet, as a 1.37 one, picks v1 from the listed services.
        dra = kubelet.dra
        assert dra is not None
        assert dra.drivers[DRIVER].health_service == "v1.DRAResourceHealth"
        await kubelet.wait_for(
            lambda: dra.device_health_message.get((DRIVER, "node-a", "acc0")) == message,
            what="acc0's message through the v1 stream",
        )


def numa_bodies(dra: dict[str, object], numa: list[int | None]) -> list[dict[str, Any]]:
    """The slices a config entry publishes, one device per entry of `numa` (its NUMA
    node, or None for none)."""
    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources import build_plugins, parse_config
    from devplug.sources.dradriver import config_driver

    groups = [
        {
            "id": f"card{i}",
            "paths": [{"path": "/dev/null"}],
            **({} if n is None else {"numaNode": n}),
        }
        for i, n in enumerate(numa)
    ]
    entry = {"name": "example.com/card", "mode": "dra", "dra": dra, "groups": groups}
    [plugin] = build_plugins(parse_config(yaml.safe_dump({"resources": [entry]})))
    plugin.publish(plugin.discover())
    return slice_bodies(config_driver(plugin), "api-check", 1)


def test_a_device_on_one_numa_node_carries_the_standard_attribute_beside_its_own() -> None:
    [body] = numa_bodies({}, [1, None])
    devices = {d["name"]: d.get("attributes", {}) for d in body["spec"]["devices"]}
    assert devices["card0"]["numaNode"] == {"int": 1}
    assert devices["card0"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert "numaNode" not in devices["card1"]
    assert "resource.kubernetes.io/numaNode" not in devices["card1"]


def test_the_api_server_accepts_the_standard_numa_attribute(kubeconfig: str) -> None:
    """The real v1.36.2 API server takes the qualified name (1.37 made it standard,
    1.36 already accepts any '<domain>/<name>')."""
    from devplug.testing.official import api_client

    with api_client(kubeconfig) as api:
        from kubernetes import client

        resource = client.ResourceV1Api(api)
        for body in numa_bodies({}, [0, 1]):
            created = resource.create_resource_slice(body, dry_run="All")
            attributes = created.spec.devices[0].attributes
            assert attributes["resource.kubernetes.io/numaNode"].int == 0


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("example.com/a/b", "with one '/' and both parts set"),
        ("/numaNode", "with one '/' and both parts set"),
        ("example.com//x", "with one '/' and both parts set"),
        ("Example.com/x", "the domain must be a lower-case DNS subdomain"),
        ("example.com/" + "x" * 33, "C identifier of at most 32 characters after the domain"),
        ("9lives", "C identifier of at most 32 characters"),
    ],
)
def test_attribute_names_that_1_38_refuses_stop_the_config_with_one_line(
    name: str, problem: str
) -> None:
    from devplug.sources import ConfigError

    with pytest.raises(ConfigError) as caught:
        numa_bodies({"attributes": {name: "x"}}, [0])
    said = str(caught.value)
    assert problem in said
    assert "dra.attributes" in said
    assert "\n" not in said


def test_qualified_attribute_names_are_published() -> None:
    [body] = numa_bodies({"attributes": {"resource.kubernetes.io/pcieRoot": "pci0000:00"}}, [0])
    [device] = body["spec"]["devices"]
    assert device["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}


def test_the_1_36_api_server_lets_through_a_name_that_1_38_refuses(kubeconfig: str) -> None:
    """Why devplug checks names itself: v1.36.2 stores 'example.com/a/b' (its check
    handles one '/' only), which 1.38 refuses; devplug never publishes it."""
    from devplug.testing.official import api_client

    [body] = numa_bodies({}, [0])
    body["spec"]["devices"][0]["attributes"]["example.com/a/b"] = {"string": "x"}
    with api_client(kubeconfig) as api:
        from kubernetes import client

        created = client.ResourceV1Api(api).create_resource_slice(body, dry_run="All")
    assert "example.com/a/b" in created.spec.devices[0].attributes


UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
LONGEST_DRIVER = "d" * 30 + "." + "e" * 32  # 63 characters, a valid driver name


def test_socket_paths_fit_af_unix_for_the_longest_driver_name_and_a_pod_uid() -> None:
    from devplug.api.dra.constants import PLUGINS_PATH, PLUGINS_REGISTRY_PATH
    from devplug.framework.dra.sockets import MAX_SOCKET_PATH, socket_path

    registry, plugins = Path(PLUGINS_REGISTRY_PATH), Path(PLUGINS_PATH) / LONGEST_DRIVER
    seen = set()
    for uid in (UID, UID.replace("0", "1")):
        for path in (
            socket_path(registry, LONGEST_DRIVER, uid, "-reg.sock"),
            socket_path(plugins, "dra", uid, ".sock"),
        ):
            assert len(bytes(path)) <= MAX_SOCKET_PATH, path
            assert path.name.endswith(".sock")
            seen.add(path)
    assert len(seen) == 4  # two pods of a rolling update never share a socket
    # A short name keeps the UID whole, as before; without a UID, the plain names.
    short = socket_path(registry, "acc.example.com", UID, "-reg.sock")
    assert short.name == f"acc.example.com-{UID}-reg.sock"
    assert socket_path(plugins, "dra", "", ".sock").name == "dra.sock"


def test_a_folder_too_long_for_any_socket_is_refused_with_one_line(short_tmp: Path) -> None:
    from devplug.framework.dra.sockets import socket_path

    folder = short_tmp / ("f" * 100)
    with pytest.raises(ValueError, match="more than the 107 a unix socket path may have") as e:
        socket_path(folder, "acc.example.com", UID, "-reg.sock")
    assert "\n" not in str(e.value)
    assert str(folder) in str(e.value)


async def test_a_driver_whose_registration_socket_would_pass_the_limit_registers(
    short_tmp: Path,
) -> None:
    """The node's folders chosen so that '<driver>-<pod UID>-reg.sock' is over 107
    bytes (bind would fail): the daemon serves a shortened name, says so once, and the
    kubelet's plugin watcher registers the driver through it and calls its dra.sock."""
    from tests.dra_helpers import Daemon, kubelet_for, serve_command

    root = short_tmp / ("p" * (45 - len(str(short_tmp)) - 1))
    dirs = NodeDirs(root)
    root.mkdir()
    full = dirs.registry / f"{DRIVER}-{UID}-reg.sock"
    assert len(bytes(full)) > 107
    config = accelerator_config(dirs, MODELS)

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log", env={"POD_UID": UID})
        try:
            await kubelet.wait_for_registration(DRIVER)
            [socket] = [p for p in dirs.registry.iterdir() if p.is_socket()]
            assert socket != full
            assert len(bytes(socket)) <= 107
            dra = kubelet.dra
            assert dra is not None
            await kubelet.wait_for(
                lambda: (DRIVER, "node-a", "acc0") in dra.device_health,
                what="the health stream read on the shortened dra.sock",
            )
        finally:
            daemon.stop()
        # One line for each socket shortened (dra.sock passes the limit here too).
        said = [line for line in daemon.output().splitlines() if "shortened" in line]
        assert len(said) == 2, said
        assert f"{DRIVER}-{UID}-reg.sock shortened to {socket}" in said[0]
        assert f"dra-{UID}.sock shortened to" in said[1]


def slice_with(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "rules-check"},
        "spec": {
            "driver": "card.example.com",
            "pool": {"name": "rules-check", "generation": 1, "resourceSliceCount": 1},
            **spec,
        },
    }
    return body


def term(node: str) -> dict[str, Any]:
    return {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}],
    }


TWO_TERMS = {"nodeSelectorTerms": [term("a"), term("b")]}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            slice_with(nodeSelector=TWO_TERMS, devices=[]),
            "spec.nodeSelector: 2 terms, the API allows exactly one",
        ),
        (
            slice_with(
                perDeviceNodeSelection=True,
                devices=[{"name": "card0", "nodeSelector": TWO_TERMS}],
            ),
            "spec.devices[0].nodeSelector: 2 terms, the API allows exactly one",
        ),
        (
            slice_with(
                nodeName="n", devices=[{"name": "card0", "attributes": {"a.io/b/c": {"int": 1}}}]
            ),
            "spec.devices[0].attributes: attribute name 'a.io/b/c' must be '<domain>/<name>'",
        ),
        (
            slice_with(nodeName="n", devices=[], skipNodeOperations=["NodePrepareResources"]),
            "NodePrepareResources without NodeUnprepareResources",
        ),
        (
            slice_with(nodeName="n", devices=[], skipNodeOperations=["Everything"]),
            "spec.skipNodeOperations: unknown ['Everything']",
        ),
    ],
)
def test_what_1_38_refuses_in_a_slice_is_named_in_one_line(
    body: dict[str, Any], problem: str
) -> None:
    from devplug.framework.dra.rules import slice_problems

    [said] = slice_problems(body)
    assert said.startswith("ResourceSlice rules-check: ")
    assert problem in said


def test_a_slice_within_the_rules_has_no_problem() -> None:
    from devplug.framework.dra.rules import slice_problems

    one = {"nodeSelectorTerms": [term("a")]}
    body = slice_with(
        perDeviceNodeSelection=True,
        skipNodeOperations=["NodePrepareResources", "NodeUnprepareResources"],
        devices=[
            {
                "name": "card0",
                "nodeSelector": one,
                "attributes": {
                    "resource.kubernetes.io/numaNode": {"int": 0},
                    "model": {"string": "x"},
                },
            }
        ],
    )
    assert slice_problems(body) == []
    assert slice_problems(slice_with(nodeSelector=one, devices=[])) == []


def test_the_1_36_api_server_stores_a_device_selector_that_1_38_refuses(kubeconfig: str) -> None:
    """v1.36.2 enforces one term on the slice's selector only; a device's two-term
    selector is stored (1.38 refuses it), which is why the rules check both."""
    from devplug.framework.dra.rules import slice_problems
    from devplug.testing.official import api_client

    body = slice_with(
        perDeviceNodeSelection=True, devices=[{"name": "card0", "nodeSelector": TWO_TERMS}]
    )
    with api_client(kubeconfig) as api:
        from kubernetes import client

        created = client.ResourceV1Api(api).create_resource_slice(body, dry_run="All")
    assert len(created.spec.devices[0].node_selector.node_selector_terms) == 2
    assert slice_problems(body)


def skip_config(tmp: Path, **entry: Any) -> Path:
    resource = {
        "name": "example.com/seat",
        "mode": "dra",
        "virtual": 2,
        "dra": {"skipNodeOperations": True},
        **entry,
    }
    config = tmp / "skip.yaml"
    config.write_text(yaml.safe_dump({"resources": [resource]}))
    return config


def test_devices_that_need_nothing_on_the_node_say_so_in_their_slices(tmp_path: Path) -> None:
    import json

    from tests.sim_helpers import devplug

    done = devplug(
        "check", "--config", str(skip_config(tmp_path)), "--node-name", "n1", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    [resource] = json.loads(done.stdout)["resources"]
    [body] = resource["slices"]
    assert body["spec"]["skipNodeOperations"] == ["*"]
    assert len(body["spec"]["devices"]) == 2


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            {"virtual": None, "groups": [{"paths": [{"path": "/dev/null"}]}]},
            "groups[0] gives containers paths",
        ),
        (
            {"virtual": None, "groups": [{"env": {"A": "1"}}]},
            "groups[0] gives containers env",
        ),
        (
            {"dra": {"skipNodeOperations": True, "deviceMetadata": True}},
            "not with 'deviceMetadata'",
        ),
        (
            {"dra": {"skipNodeOperations": True, "consumableCapacity": {"memory": {}}}},
            "not with 'partitions' or 'consumableCapacity'",
        ),
    ],
)
def test_skip_node_operations_where_containers_need_the_node_stops_the_config(
    tmp_path: Path, entry: dict[str, Any], problem: str
) -> None:
    from tests.sim_helpers import devplug

    config = skip_config(tmp_path, **entry)
    text = config.read_text().replace("virtual: null\n", "")
    config.write_text(text)
    done = devplug("check", "--config", str(config))
    assert done.returncode == 2, done.stdout
    [line] = done.stderr.strip().splitlines()
    assert "dra.skipNodeOperations" in line
    assert problem in line


def test_the_1_36_api_server_drops_skip_node_operations(kubeconfig: str, tmp_path: Path) -> None:
    """An API server without the alpha field (v1.36.2; 1.37 with the gate off) drops it
    and stores the slice: the kubelet then calls prepare, which devplug answers."""
    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources import build_plugins, load_config
    from devplug.sources.dradriver import config_driver
    from devplug.testing.official import api_client

    [plugin] = build_plugins(load_config(str(skip_config(tmp_path))))
    plugin.publish(plugin.discover())
    [body] = slice_bodies(config_driver(plugin), "api-check", 1)
    assert body["spec"]["skipNodeOperations"] == ["*"]
    with api_client(kubeconfig) as api:
        from kubernetes import client

        created = client.ResourceV1Api(api).create_resource_slice(
            body, dry_run="All", _preload_content=False
        )
    import json

    stored = json.loads(created.data)
    assert "skipNodeOperations" not in stored["spec"]
    assert [d["name"] for d in stored["spec"]["devices"]] == [
        d["name"] for d in body["spec"]["devices"]
    ]


def metadata_config(dirs: NodeDirs, on: bool = True) -> Path:
    dra = {"driver": DRIVER, "attributes": {"vendor": "xilinx"}, "deviceMetadata": on}
    return accelerator_config(dirs, MODELS, dra=dra)


def assert_metadata(dirs: NodeDirs, uid: str, device: str, where: str) -> dict[str, Any]:
    """The claim's CDI spec mounts its request's metadata file read-only at `where`,
    and the file describes `device`: the document (of the one version written)."""
    import json

    from tests.hw_helpers import validate_cdi

    spec = json.loads((dirs.cdi / f"{DRIVER}-{uid}.json").read_text())
    validate_cdi(spec)
    [meta] = [d for d in spec["devices"] if d["name"] == f"{uid}-metadata-fpga"]
    [mount] = meta["containerEdits"]["mounts"]
    assert mount["containerPath"] == f"{where}/{DRIVER}-metadata.json"
    assert "ro" in mount["options"]
    lines = Path(mount["hostPath"]).read_text().splitlines()
    [doc] = [json.loads(line) for line in lines]
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert doc["kind"] == "DeviceMetadata"
    assert doc["metadata"]["uid"] == uid
    [request] = doc["requests"]
    assert request["name"] == "fpga"
    [described] = request["devices"]
    assert described["driver"] == DRIVER
    assert described["pool"] == "node-a"
    assert described["name"] == device
    assert described["attributes"]["vendor"] == {"string": "xilinx"}
    assert described["attributes"]["model"] == {"string": MODELS[device]}
    return {"host": mount["hostPath"], **doc}


async def test_each_request_of_a_claim_gets_its_device_metadata_file(dirs: NodeDirs) -> None:
    """KEP-5304's file: one per request, its devices with the slices' attributes, at
    the path the pod spec names, bind-mounted read-only through the claim's CDI spec;
    gone at unprepare. A claim made from a template is found under the pod's name."""
    from devplug.api.dra.v1 import api_pb2 as drapb
    from devplug.api.dra.v1 import api_pb2_grpc as dragrpc
    from tests.dra_helpers import allocated_claim

    config = metadata_config(dirs)
    dirs.claims.mkdir(exist_ok=True)
    direct = allocated_claim("claim-a", "uid-a", ["acc0"], request="fpga")
    made = allocated_claim("pod-x-acc-7k2x9", "uid-b", ["acc1"], request="fpga")
    made["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "acc"}
    for claim in (direct, made):
        name = claim["metadata"]["name"]
        (dirs.claims / f"{name}.yaml").write_text(yaml.safe_dump(claim))
    base = "/var/run/kubernetes.io/dra-device-attributes"
    docs: list[dict[str, Any]] = []

    async with (
        serving(dirs, config),
        unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel,
    ):
        stub = dragrpc.DRAPluginStub(channel)
        claims = [
            drapb.Claim(namespace="default", uid="uid-a", name="claim-a"),
            drapb.Claim(namespace="default", uid="uid-b", name="pod-x-acc-7k2x9"),
        ]
        answer = await stub.NodePrepareResources(
            drapb.NodePrepareResourcesRequest(claims=claims), timeout=10
        )
        for uid, device, where in (
            ("uid-a", "acc0", f"{base}/resourceclaims/claim-a/fpga"),
            ("uid-b", "acc1", f"{base}/resourceclaimtemplates/acc/fpga"),
        ):
            entry = answer.claims[uid]
            assert entry.error == ""
            [prepared] = entry.devices
            ids = list(prepared.cdi_device_ids)
            assert ids[-1] == f"{DRIVER}/claim={uid}-metadata-fpga", ids
            docs.append(assert_metadata(dirs, uid, device, where))
        await stub.NodeUnprepareResources(
            drapb.NodeUnprepareResourcesRequest(claims=claims), timeout=10
        )
    assert "podClaimName" not in docs[0]
    assert docs[1]["podClaimName"] == "acc"
    assert_removed(docs)


def assert_removed(docs: list[dict[str, Any]]) -> None:
    """The metadata files of `docs` and their claim's folder are gone."""
    for doc in docs:
        assert not Path(doc["host"]).exists()
        assert not Path(doc["host"]).parent.parent.exists()


async def test_without_device_metadata_a_claim_gets_no_file(dirs: NodeDirs) -> None:
    from devplug.api.dra.v1 import api_pb2 as drapb
    from devplug.api.dra.v1 import api_pb2_grpc as dragrpc
    from tests.dra_helpers import write_claim

    config = metadata_config(dirs, on=False)
    write_claim(dirs, "claim-a", "uid-a", ["acc0"])

    async with (
        serving(dirs, config),
        unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel,
    ):
        answer = await dragrpc.DRAPluginStub(channel).NodePrepareResources(
            drapb.NodePrepareResourcesRequest(
                claims=[drapb.Claim(namespace="default", uid="uid-a", name="claim-a")]
            ),
            timeout=10,
        )
        [device] = answer.claims["uid-a"].devices
        assert not any("metadata" in i for i in device.cdi_device_ids)
        assert not list(dirs.plugins.glob("**/dra-device-metadata"))


async def test_the_simulated_kubelet_skips_the_calls_an_allocation_says_to_skip(
    dirs: NodeDirs,
) -> None:
    """As a 1.37 kubelet with DRAOptionalNodeOperations: a claim whose devices of a
    driver all skip the node operations is ready without that driver (not even
    registered); without the field the kubelet needs the driver."""
    from devplug.simulator.dra import PrepareError
    from devplug.simulator.pods import PodSpec, parse_pod
    from tests.dra_helpers import allocated_claim, claim_pod, kubelet_for

    dirs.claims.mkdir(parents=True, exist_ok=True)
    skipped = allocated_claim("seat-claim", "uid-s", ["seat0"])
    for result in skipped["status"]["allocation"]["devices"]["results"]:
        result["skipNodeOperations"] = ["*"]
    plain = allocated_claim("plain-claim", "uid-p", ["seat1"])
    for claim in (skipped, plain):
        (dirs.claims / f"{claim['metadata']['name']}.yaml").write_text(yaml.safe_dump(claim))
    seats = slice_with(
        nodeName="node-a", devices=[{"name": "seat0"}, {"name": "seat1"}], driver=DRIVER
    )
    seats["spec"]["pool"]["name"] = "node-a"
    (dirs.claims / "seats.yaml").write_text(yaml.safe_dump(seats))

    async with kubelet_for(dirs) as kubelet:
        dra = kubelet.dra
        assert dra is not None
        assert DRIVER not in dra.drivers
        seat = parse_pod(claim_pod("seat", "seat-claim"))
        assert isinstance(seat, PodSpec)
        assert await dra.prepare_pod(seat) == {}
        other = parse_pod(claim_pod("other", "plain-claim"))
        assert isinstance(other, PodSpec)
        with pytest.raises(PrepareError, match=f"DRA driver {DRIVER} is not registered"):
            await dra.prepare_pod(other)
