"""Every wire API devplug speaks is the one the real kubelet v1.36.2 speaks: each of our
.proto files is compared, message by message and field by field, with the descriptor
that the Go protobuf compiler embedded into the kubelet binary (`../shared/k8s/
kubelet.xz`, the kubelet of the real-node tests). Nothing hand-written stands in for
the kubelet here: a field we invented, forgot or numbered wrong fails.

Skipped, saying how to provide it, where the kubelet binary is absent.
"""

from __future__ import annotations

import importlib
import lzma
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from devplug.testing.controlplane import source_dir

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "staging/src/k8s.io/kubelet/pkg/apis"
# Our generated module -> the upstream file it mirrors (named in each .proto's header).
MIRRORS = {
    "devplug.api.v1beta1.api_pb2": "deviceplugin/v1beta1/api.proto",
    "devplug.api.podresources.v1.api_pb2": "podresources/v1/api.proto",
    "devplug.api.pluginregistration.v1.api_pb2": "pluginregistration/v1/api.proto",
    "devplug.api.dra.v1.api_pb2": "dra/v1/api.proto",
    "devplug.api.dra.v1beta1.api_pb2": "dra/v1beta1/api.proto",
    "devplug.api.drahealth.v1alpha1.api_pb2": "dra-health/v1alpha1/api.proto",
}
# How far past the last complete parse to keep trying longer prefixes: the embedded
# descriptor is followed by unrelated bytes.
_SLACK = 4096


@cache
def kubelet_binary() -> bytes:
    folder = source_dir(ROOT)
    packed = (folder / "kubelet.xz") if folder else ROOT.parent / "shared" / "k8s" / "kubelet.xz"
    if not packed.is_file():
        pytest.skip(
            f"the kubelet binary is not available: put kubelet.xz (v1.36.2) in {packed.parent}"
        )
    with lzma.open(packed) as f:
        return f.read()


def embedded_descriptor(binary: bytes, name: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of `name` compiled into a Go binary: it starts with
    field 1 (the file name) and is the longest prefix from there that parses back to
    exactly its own bytes."""
    key = name.encode()
    marker = b"\n" + bytes([len(key)]) + key
    start = binary.find(marker)
    assert start >= 0, f"{name} is not in the kubelet binary"
    best: descriptor_pb2.FileDescriptorProto | None = None
    end = start + len(marker)
    last = end
    while end < last + _SLACK:
        end += 1
        candidate = descriptor_pb2.FileDescriptorProto()
        try:
            candidate.ParseFromString(binary[start:end])
        except DecodeError:
            continue
        if candidate.name == name and len(candidate.SerializeToString()) == end - start:
            best, last = candidate, end
    assert best is not None, f"cannot read the descriptor of {name}"
    return best


def ours(module: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    importlib.import_module(module).DESCRIPTOR.CopyToProto(proto)
    return proto


def messages(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Message -> field -> what the wire depends on (number, type, label, message or
    enum type by its short name, proto3 optional), nested messages included."""

    def walk(found: Any, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for message in found:
            name = prefix + message.name
            out[name] = {
                f.name: (
                    f.number,
                    f.type,
                    f.label,
                    f.type_name.rpartition(".")[2],
                    f.proto3_optional,
                )
                for f in message.field
            }
            out.update(walk(message.nested_type, f"{name}."))
        return out

    return walk(file.message_type, "")


def services(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    return {
        s.name: {
            m.name: (
                m.input_type.rpartition(".")[2],
                m.output_type.rpartition(".")[2],
                m.client_streaming,
                m.server_streaming,
            )
            for m in s.method
        }
        for s in file.service
    }


def enums(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    return {e.name: {v.name: v.number for v in e.value} for e in file.enum_type}


@pytest.mark.parametrize(("module", "upstream"), sorted(MIRRORS.items()))
def test_proto_is_what_the_kubelet_speaks(module: str, upstream: str) -> None:
    theirs = embedded_descriptor(kubelet_binary(), f"{UPSTREAM}/{upstream}")
    mine = ours(module)
    assert mine.package == theirs.package  # part of every gRPC method path
    assert messages(mine) == messages(theirs)
    assert enums(mine) == enums(theirs)
    assert services(mine) == services(theirs)


def test_every_proto_names_the_upstream_file_and_version_it_mirrors() -> None:
    protos = sorted((ROOT / "src" / "devplug" / "api").glob("**/*.proto"))
    mirrored = {
        str(p.relative_to(ROOT / "src").with_name("api_pb2")).replace("/", "."): p for p in protos
    }
    assert set(mirrored) == set(MIRRORS), "a .proto without an upstream file it mirrors"
    for module, proto in mirrored.items():
        header = proto.read_text().partition("syntax")[0]
        assert f"Mirrors {UPSTREAM}/{MIRRORS[module]} of Kubernetes v1.36.2" in " ".join(
            line.removeprefix("//").strip() for line in header.splitlines()
        ), proto


def test_the_kubelet_knows_no_other_dra_health_version() -> None:
    """The 1.36 kubelet has dra-health v1alpha1 only: no v1beta1 or v1 to offer."""
    binary = kubelet_binary()
    assert b"v1alpha1.DRAResourceHealth" in binary
    for version in (b"v1beta1", b"v1"):
        assert f"{UPSTREAM}/dra-health/{version.decode()}/api.proto".encode() not in binary
