"""Simulator pieces without processes: checkpoint format, manifests, topology, messages."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import grpc
import pytest
from sim_helpers import BAR, FOO, pod, pods_yaml

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator import checkpoint
from devplug.simulator.endpoint import go_code_name
from devplug.simulator.podlist import PodList
from devplug.simulator.pods import InvalidPod, ManifestError, PodSpec, parse_pods, parse_quantity
from devplug.simulator.registration import request_problem
from devplug.simulator.topology import (
    POLICY_BEST_EFFORT,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    TopologyHint,
    device_hints,
    mask_of,
    merge,
)

# Checksums computed by go-spew 1.1.1 + hash/fnv over the kubelet's checkpoint types, as
# the kubelet computes them, for these exact files.
GO_VERIFIED = [
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c",'
        '"ResourceName":"example.com/foo","DeviceIDs":{"-1":["z"],"0":["a","b"]},'
        '"AllocResp":"CgIKAA=="}],"RegisteredDevices":{"example.com/foo":["a","b"]}},'
        '"Checksum":2861356015}'
    ),
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"798fd9fa-ab59-4f08-a8d7-7e1e34e774fd",'
        '"ContainerName":"c","ResourceName":"example.com/foo","DeviceIDs":{"0":["a"]},'
        '"AllocResp":""}],"RegisteredDevices":{"example.com/foo":["a","b","c"]}},'
        '"Checksum":2393807091}'
    ),
]


@pytest.mark.parametrize("blob", GO_VERIFIED)
def test_checkpoint_checksum_matches_the_kubelet(blob: str) -> None:
    data = checkpoint.decode(blob.encode())
    assert checkpoint.encode(data) == blob.encode()  # byte for byte, as Go writes it


def test_checkpoint_round_trip_keeps_null_and_empty_apart(tmp_path: Path) -> None:
    data = checkpoint.CheckpointData(
        [
            checkpoint.Entry("u", "c", FOO, {1: ["x"], -1: ["y"]}, b""),
            checkpoint.Entry("u", "d", FOO, {0: []}, None),
        ],
        {FOO: [], "example.com/bar": None, "é<&": ["1"]},
    )
    path = tmp_path / "kubelet_internal_checkpoint"
    checkpoint.write(path, data)
    assert checkpoint.read(path) == data
    raw = json.loads(path.read_text())
    assert raw["Data"]["PodDeviceEntries"][1]["AllocResp"] is None
    assert raw["Data"]["RegisteredDevices"]["example.com/bar"] is None
    assert "\\u003c\\u0026" in path.read_text()  # escaped as encoding/json does
    assert not list(tmp_path.glob(".kubelet_internal_checkpoint.*"))  # no temp files left


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b'{"Data":{},"Checksum":1}', "checkpoint is corrupted"),
        (b'{"Data":{"PodDeviceEntries":[{"DeviceIDs":["a"]}]},"Checksum":1}', "NUMA node"),
        (b'{"Data":{"RegisteredDevices":{"x":[1]}},"Checksum":1}', "list of strings"),
    ],
)
def test_checkpoint_problems_are_named(blob: bytes, problem: str) -> None:
    with pytest.raises(checkpoint.CheckpointError, match=problem):
        checkpoint.decode(blob)


def test_checkpoint_of_an_empty_node() -> None:
    data = checkpoint.CheckpointData(None, {})
    assert checkpoint.decode(checkpoint.encode(data)) == data


def fnv1a32_reference(data: bytes, state: int = 0x811C9DC5) -> int:
    # FNV-1a, 32 bit, byte by byte as its definition reads.
    for byte in data:
        state = ((state ^ byte) * 0x01000193) % 2**32
    return state


def test_fnv_continued_from_any_state_is_fnv() -> None:
    rng = random.Random(1)
    for _ in range(500):
        data = rng.randbytes(rng.randrange(300))
        state = rng.getrandbits(32)
        assert checkpoint._fnv1a32_from(state, data) == fnv1a32_reference(data, state)
    head, tail = b"(checkpoint.checkpointData){", b"RegisteredDevices:map[]}"
    middle = checkpoint._fnv1a32_from(fnv1a32_reference(head), tail)
    assert middle == fnv1a32_reference(head + tail)


def test_checkpoint_writer_writes_what_a_whole_encode_writes(tmp_path: Path) -> None:
    """Random adds, replacements, removals and device lists: after each, the file is
    byte for byte the encoding of the entries in the checkpoint's order (pods and
    containers as added, resources by name), with a checksum the decoder accepts."""
    rng = random.Random(2)
    writer = checkpoint.CheckpointWriter(tmp_path / "kubelet_internal_checkpoint")
    model: dict[str, dict[str, dict[str, checkpoint.Entry]]] = {}
    registered: dict[str, list[str]] = {}
    appended = 0
    for step in range(400):
        roll = rng.random()
        if roll < 0.7:
            uid = rng.choice([f"pod-{step}", f"pod-{step}", *list(model)[-2:]])
            container, resource = rng.choice("cd"), rng.choice([FOO, BAR, "b.io/z"])
            numa = {rng.choice([-1, 0, 1, 10]): [f"d{rng.randrange(9)}"]}
            entry = checkpoint.Entry(uid, container, resource, numa, rng.randbytes(6))
            appended += uid not in model
            writer.put(entry)
            model.setdefault(uid, {}).setdefault(container, {})[resource] = entry
        elif roll < 0.9 and model:
            uid = rng.choice(list(model))
            assert writer.remove_pod(uid)
            del model[uid]
        else:
            registered = {r: [f"d{i}" for i in range(rng.randrange(4))] for r in (FOO, "é<&")}
            writer.set_registered(registered)
        entries = [model[u][c][r] for u in model for c in model[u] for r in sorted(model[u][c])]
        expected = checkpoint.CheckpointData(entries or None, registered)
        assert writer.data() == expected
        assert writer.encode() == checkpoint.encode(expected), step
    assert appended > 100
    assert not writer.remove_pod("nobody")
    writer.write()
    assert checkpoint.read(writer.path) == writer.data()


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), (3, 3), ("500m", Fraction(1, 2)), ("1k", 1000), ("1Ki", 1024), ("2e2", 200)],
)
def test_quantities(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


def first_invalid(manifest: dict[str, object]) -> str:
    [result] = parse_pods(manifest)
    assert isinstance(result, InvalidPod)
    return result.message


def test_requests_must_equal_limits() -> None:
    message = first_invalid(pod("bad", {"c": {FOO: 1}}, requests={"c": {FOO: 2}}))
    assert message == (
        'Pod "bad" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
        "must be equal to example.com/foo limit of 1"
    )


def test_requests_need_limits_and_integers() -> None:
    message = first_invalid(pod("bad", {"c": {}}, requests={"c": {FOO: 1}}))
    assert message.endswith(
        "spec.containers[0].resources.limits: Required value: Limit must be set for non "
        "overcommitable resources"
    )
    message = first_invalid(pod("half", {"c": {FOO: "500m"}}))
    assert message.endswith(
        "spec.containers[0].resources.limits[example.com/foo]: Invalid value: 500m: "
        "must be an integer"
    )


def test_manifests_several_documents_init_and_sidecars() -> None:
    text = pods_yaml(
        pod(
            "a",
            {"app": {FOO: 2, "cpu": "500m"}},
            init={"setup": {FOO: 1}, "side": {}},
            sidecars=["side"],
        ),
        pod("b", {"app": {}}, namespace="team"),
    )
    a, b = parse_pods(text)
    assert isinstance(a, PodSpec)
    assert isinstance(b, PodSpec)
    assert [(c.name, c.init, c.restartable, dict(c.devices)) for c in a.all_containers] == [
        ("setup", True, False, {FOO: 1}),
        ("side", True, True, {}),
        ("app", False, False, {FOO: 2}),
    ]
    assert (b.namespace, b.name) == ("team", "b")
    with pytest.raises(ManifestError, match="kind 'Deployment'"):
        parse_pods("kind: Deployment\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="invalid YAML"):
        parse_pods("a: [")


def test_registration_request_checks(tmp_path: Path) -> None:
    def problem(**fields: str) -> str | None:
        request = pb.RegisterRequest(version="v1beta1", endpoint="p.sock", resource_name=FOO)
        for key, value in fields.items():
            setattr(request, key, value)
        return request_problem(request, tmp_path)

    assert problem() is None
    assert problem(version="v1") == (
        'requested API version "v1" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    assert problem(resource_name="foo") == 'the ResourceName "foo" is invalid'
    assert problem(resource_name="kubernetes.io/gpu") == (
        'the ResourceName "kubernetes.io/gpu" is invalid'
    )
    for endpoint in ("", "../p.sock", "sub/p.sock", ".."):
        message = problem(endpoint=endpoint)
        assert message is not None
        assert message.startswith("failed to dial device plugin:")


def test_go_code_names() -> None:
    assert go_code_name(grpc.StatusCode.INVALID_ARGUMENT) == "InvalidArgument"
    assert go_code_name(grpc.StatusCode.CANCELLED) == "Canceled"
    assert go_code_name(grpc.StatusCode.UNKNOWN) == "Unknown"


TOPOLOGY = {"n0a": (0,), "n0b": (0,), "n1a": (1,)}


def test_device_hints_as_the_kubelet_builds_them() -> None:
    # 3 devices cannot fit one node: only {0,1}, preferred (nothing narrower could).
    assert device_hints([0, 1], TOPOLOGY, list(TOPOLOGY), [], 3) == [TopologyHint(0b11, True)]
    # 2 fit node 0 (preferred) or both nodes (not preferred).
    assert device_hints([0, 1], TOPOLOGY, list(TOPOLOGY), [], 2) == [
        TopologyHint(0b01, True),
        TopologyHint(0b11, False),
    ]
    # Node 0 busy but for one device: only {0,1} remains, not preferred.
    assert device_hints([0, 1], TOPOLOGY, ["n0b", "n1a"], [], 2) == [TopologyHint(0b11, False)]
    # Reusable devices pin the masks that can be used.
    assert device_hints([0, 1], TOPOLOGY, ["n0b", "n1a"], ["n1a"], 1) == [
        TopologyHint(0b10, True),
        TopologyHint(0b11, False),
    ]


def test_policies_merge() -> None:
    preferred_pair = {FOO: [TopologyHint(0b11, True)]}
    assert merge(POLICY_BEST_EFFORT, [0, 1], preferred_pair) == (TopologyHint(0b11, True), True)
    assert merge(POLICY_RESTRICTED, [0, 1], preferred_pair)[1] is True
    assert merge(POLICY_SINGLE_NUMA_NODE, [0, 1], preferred_pair)[1] is False
    spread = {FOO: [TopologyHint(0b11, False)]}
    assert merge(POLICY_BEST_EFFORT, [0, 1], spread) == (TopologyHint(0b11, False), True)
    assert merge(POLICY_RESTRICTED, [0, 1], spread)[1] is False
    # Two resources: the narrowest preferred mask both can share wins.
    both = {
        FOO: [TopologyHint(0b01, True), TopologyHint(0b10, True), TopologyHint(0b11, False)],
        "example.com/bar": [TopologyHint(0b10, True), TopologyHint(0b11, False)],
    }
    assert merge(POLICY_RESTRICTED, [0, 1], both) == (TopologyHint(0b10, True), True)
    # No hints (no topology) and no request mean "any node", which every policy admits.
    assert merge(POLICY_SINGLE_NUMA_NODE, [0, 1], {FOO: None}) == (TopologyHint(None, True), True)
    assert merge(POLICY_RESTRICTED, [0, 1], {}) == (TopologyHint(mask_of([0, 1]), True), True)
    # A resource no NUMA set can satisfy.
    assert merge(POLICY_RESTRICTED, [0, 1], {FOO: []})[1] is False


def test_pod_list_appends_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "simulator_pods.json"
    pods = PodList(path)
    assert pods.load() == []
    pods.reset([])
    items = [{"uid": f"u{i}", "manifest": {"metadata": {"name": f"p{i}"}}} for i in range(300)]
    for item in items:
        pods.add(str(item["uid"]), item)
    assert len(path.read_text().splitlines()) == 300  # one line per admission
    for item in items[:250]:
        pods.remove(str(item["uid"]))
    pods.remove("unknown")
    # Deletions are appended until they make up most of the file, then it is rewritten.
    assert len(path.read_text().splitlines()) <= 2 * 50 + 64 + 1
    assert PodList(path).load() == items[250:]
    # A line cut short (a crash while appending) is skipped, and the start rewrites it.
    with path.open("a") as f:
        f.write('{"uid":"u9')
    again = PodList(path)
    assert again.load() == items[250:]
    again.reset((str(i["uid"]), i) for i in items[250:])
    assert len(path.read_text().splitlines()) == 50


def test_pod_list_reads_the_one_document_layout(tmp_path: Path) -> None:
    path = tmp_path / "simulator_pods.json"
    items = [{"uid": "a", "manifest": {}}, {"uid": "b", "manifest": {}}]
    path.write_text(json.dumps({"pods": items}))
    assert PodList(path).load() == items
