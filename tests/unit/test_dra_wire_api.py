"""The DRA wire APIs match the kubelet's: packages (part of the gRPC method paths),
services, field names, numbers, types and repetition."""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from devplug.api.dra import constants
from devplug.api.dra.v1 import api_pb2 as dra_v1
from devplug.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from devplug.api.drahealth.v1 import api_pb2 as health_v1
from devplug.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug.api.pluginregistration.v1 import api_pb2 as registration

S, B, I64, MSG, ENUM = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_MESSAGE,
    FieldDescriptor.TYPE_ENUM,
)

# message -> {field: (number, type, repeated)}, from the kubelet's API definitions
# (test_upstream_protos.py checks all of them against the kubelet binary itself).
REGISTRATION = {
    "PluginInfo": {
        "type": (1, S, False),
        "name": (2, S, False),
        "endpoint": (3, S, False),
        "supported_versions": (4, S, True),
    },
    "RegistrationStatus": {"plugin_registered": (1, B, False), "error": (2, S, False)},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}
DRA_V1BETA1 = {
    "NodePrepareResourcesRequest": {"claims": (1, MSG, True)},
    "NodePrepareResourcesResponse": {"claims": (1, MSG, True)},  # map<string, ...>
    "NodePrepareResourceResponse": {"devices": (1, MSG, True), "error": (2, S, False)},
    "Device": {
        "request_names": (1, S, True),
        "pool_name": (2, S, False),
        "device_name": (3, S, False),
        "cdi_device_ids": (4, S, True),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, MSG, True)},
    "NodeUnprepareResourcesResponse": {"claims": (1, MSG, True)},
    "NodeUnprepareResourceResponse": {"error": (1, S, False)},
    "Claim": {"namespace": (1, S, False), "uid": (2, S, False), "name": (3, S, False)},
}
DRA_V1 = {
    **DRA_V1BETA1,
    "Device": {**DRA_V1BETA1["Device"], "share_id": (5, S, False)},
}
HEALTH_V1ALPHA1 = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, S, False), "device_name": (2, S, False)},
    "DeviceHealth": {
        "device": (1, MSG, False),
        "health": (2, ENUM, False),
        "last_updated_time": (3, I64, False),
        "health_check_timeout_seconds": (4, I64, False),
        "message": (5, S, False),
    },
    "NodeWatchResourcesResponse": {"devices": (1, MSG, True)},
}


def fields(module: ModuleType, message: str) -> dict[str, tuple[int, int, bool]]:
    descriptor = module.DESCRIPTOR.message_types_by_name[message]
    return {f.name: (f.number, f.type, bool(f.is_repeated)) for f in descriptor.fields}


def methods(module: ModuleType, service: str) -> dict[str, tuple[bool, str, str]]:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    return {
        m.name: (m.server_streaming, m.input_type.name, m.output_type.name)
        for m in descriptor.methods
    }


CASES = [
    (registration, "pluginregistration", REGISTRATION),
    (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1", DRA_V1),
    (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DRA_V1BETA1),
    (health_v1alpha1, "v1alpha1", HEALTH_V1ALPHA1),
    (health_v1, "v1", HEALTH_V1ALPHA1),  # the same messages, package v1
]


@pytest.mark.parametrize(("module", "package", "messages"), CASES)
def test_messages_match_the_kubelet(
    module: ModuleType, package: str, messages: dict[str, dict[str, tuple[int, int, bool]]]
) -> None:
    assert module.DESCRIPTOR.package == package
    assert set(module.DESCRIPTOR.message_types_by_name) == set(messages)
    for message, expected in messages.items():
        assert fields(module, message) == expected, message


def test_services_match_the_kubelet() -> None:
    assert methods(registration, "Registration") == {
        "GetInfo": (False, "InfoRequest", "PluginInfo"),
        "NotifyRegistrationStatus": (False, "RegistrationStatus", "RegistrationStatusResponse"),
    }
    for module in (dra_v1, dra_v1beta1):
        assert methods(module, "DRAPlugin") == {
            "NodePrepareResources": (
                False,
                "NodePrepareResourcesRequest",
                "NodePrepareResourcesResponse",
            ),
            "NodeUnprepareResources": (
                False,
                "NodeUnprepareResourcesRequest",
                "NodeUnprepareResourcesResponse",
            ),
        }
        response = module.DESCRIPTOR.message_types_by_name["NodePrepareResourcesResponse"]
        entry = response.fields_by_name["claims"].message_type
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == S
    for module in (health_v1, health_v1alpha1):
        assert methods(module, "DRAResourceHealth") == {
            "NodeWatchResources": (True, "NodeWatchResourcesRequest", "NodeWatchResourcesResponse")
        }
        status = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
        assert {v.name: v.number for v in status.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }


def test_wire_bytes_match_the_kubelet_encoding() -> None:
    # Field 1 (claims) holding field 2 (uid): tags 0x0a and 0x12.
    request = dra_v1.NodePrepareResourcesRequest(claims=[dra_v1.Claim(uid="u")])
    assert request.SerializeToString() == b"\x0a\x03\x12\x01u"
    info = registration.PluginInfo(type="DRAPlugin")
    assert info.SerializeToString() == b"\x0a\x09DRAPlugin"


def test_constants() -> None:
    assert constants.DRA_PLUGIN_TYPE == "DRAPlugin"
    # "<last part of the proto package>.<service>", as the kubelet matches them (its
    # DRAPluginService and DRAResourceHealthService constants).
    modules = {
        "v1.DRAPlugin": dra_v1,
        "v1beta1.DRAPlugin": dra_v1beta1,
        "v1.DRAResourceHealth": health_v1,
        "v1alpha1.DRAResourceHealth": health_v1alpha1,
    }
    assert tuple(modules) == constants.SUPPORTED_VERSIONS
    for name, module in modules.items():
        package, _, service = name.partition(".")
        assert module.DESCRIPTOR.package.rpartition(".")[2] == package
        assert service in module.DESCRIPTOR.services_by_name
    assert constants.PLUGINS_REGISTRY_PATH == "/var/lib/kubelet/plugins_registry"
    assert constants.PLUGINS_PATH == "/var/lib/kubelet/plugins"
    assert constants.DRA_SOCKET == "dra.sock"
