"""Simulator pieces without processes: checkpoint format, manifests, topology, messages."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import grpc
import pytest
from sim_helpers import FOO, pod, pods_yaml

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator import checkpoint
from devplug.simulator.endpoint import go_code_name
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
