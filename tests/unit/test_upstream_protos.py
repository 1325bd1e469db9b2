"""Every wire API devplug speaks is the one the real kubelet speaks: each of our .proto
files is compared, message by message and field by field, with the descriptor that the
Go protobuf compiler embedded into the kubelet binary v1.36.2 (`../shared/k8s/
kubelet.xz`, the kubelet of the real-node tests). Nothing hand-written stands in for
the kubelet here: a field we invented, forgot or numbered wrong fails.

Kubernetes 1.37 is checked the same way, against descriptors made from that binary's
and the changes 1.37 made to these files (`V1_37`), read in the upstream sources
(staging/src/k8s.io/kubelet/pkg/apis after v1.37.0-beta.0): no 1.37 kubelet binary is
at hand, so the changes are written down from the upstream .proto text, and only they.

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

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = "staging/src/k8s.io/kubelet/pkg/apis"
# Our generated module -> the upstream file it mirrors and the Kubernetes version of
# that file (both named in each .proto's header).
MIRRORS = {
    "devplug.api.v1beta1.api_pb2": ("deviceplugin/v1beta1/api.proto", "v1.36.2"),
    "devplug.api.podresources.v1.api_pb2": ("podresources/v1/api.proto", "v1.37"),
    "devplug.api.pluginregistration.v1.api_pb2": ("pluginregistration/v1/api.proto", "v1.36.2"),
    "devplug.api.dra.v1.api_pb2": ("dra/v1/api.proto", "v1.36.2"),
    "devplug.api.dra.v1beta1.api_pb2": ("dra/v1beta1/api.proto", "v1.36.2"),
    "devplug.api.drahealth.v1alpha1.api_pb2": ("dra-health/v1alpha1/api.proto", "v1.36.2"),
    "devplug.api.drahealth.v1.api_pb2": ("dra-health/v1/api.proto", "v1.37"),
}
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
# What Kubernetes 1.37 changed in these files, from the upstream .proto text:
# - dra-health/v1/api.proto is new: v1alpha1's messages, enum and service under package
#   v1 (commit "DRA kubelet: add v1 DRAResourceHealth gRPC API");
# - podresources/v1/api.proto: PodResources gained `repeated int64 cpu_ids = 4` and
#   `repeated ContainerMemory memory = 5` (pod-level resources).
# Every other file is the same as in v1.36.2.
V1_37_NEW = {"dra-health/v1/api.proto": ("dra-health/v1alpha1/api.proto", "v1")}
V1_37_FIELDS = {
    "podresources/v1/api.proto": {
        "PodResources": {
            "cpu_ids": (4, _INT64, _REPEATED, "", False),
            "memory": (5, _MESSAGE, _REPEATED, "ContainerMemory", False),
        }
    }
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


def wire(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """All a client and a server must agree on: the package (part of every gRPC method
    path), messages, enums and services."""
    return {
        "package": file.package,
        "messages": messages(file),
        "enums": enums(file),
        "services": services(file),
    }


def upstream_1_36(name: str) -> dict[str, Any]:
    return wire(embedded_descriptor(kubelet_binary(), f"{UPSTREAM}/{name}"))


def upstream_1_37(name: str) -> dict[str, Any]:
    """The file as Kubernetes 1.37 has it: v1.36.2's, with 1.37's changes applied."""
    if name in V1_37_NEW:
        like, package = V1_37_NEW[name]
        return {**upstream_1_36(like), "package": package}
    found = upstream_1_36(name)
    for message, added in V1_37_FIELDS.get(name, {}).items():
        assert not set(added) & set(found["messages"][message]), f"{name}: already in 1.36"
        found["messages"][message] = {**found["messages"][message], **added}
    return found


def without_1_37_fields(name: str, found: dict[str, Any]) -> dict[str, Any]:
    messages = {
        message: {
            k: v for k, v in fields.items() if k not in V1_37_FIELDS.get(name, {}).get(message, {})
        }
        for message, fields in found["messages"].items()
    }
    return {**found, "messages": messages}


@pytest.mark.parametrize(("module", "upstream"), sorted(MIRRORS.items()))
def test_proto_is_what_the_1_37_kubelet_speaks(module: str, upstream: tuple[str, str]) -> None:
    assert wire(ours(module)) == upstream_1_37(upstream[0])


@pytest.mark.parametrize(
    ("module", "upstream"), sorted((m, u) for m, u in MIRRORS.items() if u[0] not in V1_37_NEW)
)
def test_proto_is_what_the_1_36_kubelet_speaks(module: str, upstream: tuple[str, str]) -> None:
    """Every field the v1.36.2 kubelet knows has its number and type; what 1.37 added
    is all there is beyond (a 1.36 peer skips those fields as unknown)."""
    assert without_1_37_fields(upstream[0], wire(ours(module))) == upstream_1_36(upstream[0])


def test_the_1_37_changes_are_what_1_37_added() -> None:
    """The recorded changes name only what v1.36.2 lacks: a new file is absent from the
    1.36 kubelet, and the 1.36 messages hold no field of those names or numbers."""
    binary = kubelet_binary()
    for name in V1_37_NEW:
        assert f"{UPSTREAM}/{name}".encode() not in binary
    for name, changes in V1_37_FIELDS.items():
        found = upstream_1_36(name)["messages"]
        for message, added in changes.items():
            numbers = {f[0] for f in found[message].values()}
            assert not {f[0] for f in added.values()} & numbers, (name, message)


def test_every_proto_names_the_upstream_file_and_version_it_mirrors() -> None:
    protos = sorted((ROOT / "src" / "devplug" / "api").glob("**/*.proto"))
    mirrored = {
        str(p.relative_to(ROOT / "src").with_name("api_pb2")).replace("/", "."): p for p in protos
    }
    assert set(mirrored) == set(MIRRORS), "a .proto without an upstream file it mirrors"
    for module, proto in mirrored.items():
        header = proto.read_text().partition("syntax")[0]
        upstream, version = MIRRORS[module]
        assert f"Mirrors {UPSTREAM}/{upstream} of Kubernetes {version}" in " ".join(
            line.removeprefix("//").strip() for line in header.splitlines()
        ), proto


def test_the_kubelet_knows_no_other_dra_health_version() -> None:
    """The 1.36 kubelet has dra-health v1alpha1 only: no v1beta1 or v1 to offer."""
    binary = kubelet_binary()
    assert b"v1alpha1.DRAResourceHealth" in binary
    for version in (b"v1beta1", b"v1"):
        assert f"{UPSTREAM}/dra-health/{version.decode()}/api.proto".encode() not in binary
