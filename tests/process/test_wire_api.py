"""The wire API matches the kubelet's field names and numbers, and its modules are fresh."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from devplug.api import constants
from devplug.api.podresources.v1 import api_pb2 as podres
from devplug.api.v1beta1 import api_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]

# message -> {field: (number, repeated)}; from the kubelet's deviceplugin/v1beta1 API.
V1BETA1 = {
    "RegisterRequest": {
        "version": (1, False),
        "endpoint": (2, False),
        "resource_name": (3, False),
        "options": (4, False),
    },
    "DevicePluginOptions": {
        "pre_start_required": (1, False),
        "get_preferred_allocation_available": (2, False),
    },
    "Device": {"ID": (1, False), "health": (2, False), "topology": (3, False)},
    "TopologyInfo": {"nodes": (1, True)},
    "NUMANode": {"ID": (1, False)},
    "ListAndWatchResponse": {"devices": (1, True)},
    "PreferredAllocationRequest": {"container_requests": (1, True)},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, True),
        "must_include_deviceIDs": (2, True),
        "allocation_size": (3, False),
    },
    "PreferredAllocationResponse": {"container_responses": (1, True)},
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, True)},
    "AllocateRequest": {"container_requests": (1, True)},
    "ContainerAllocateRequest": {"devices_ids": (1, True)},
    "AllocateResponse": {"container_responses": (1, True)},
    "ContainerAllocateResponse": {
        "envs": (1, True),
        "mounts": (2, True),
        "devices": (3, True),
        "annotations": (4, True),
        "cdi_devices": (5, True),
    },
    "Mount": {"container_path": (1, False), "host_path": (2, False), "read_only": (3, False)},
    "DeviceSpec": {
        "container_path": (1, False),
        "host_path": (2, False),
        "permissions": (3, False),
    },
    "CDIDevice": {"name": (1, False)},
    "PreStartContainerRequest": {"devices_ids": (1, True)},
    "PreStartContainerResponse": {},
    "Empty": {},
}


def is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


@pytest.mark.parametrize("message", sorted(V1BETA1))
def test_v1beta1_messages(message: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    actual = {f.name: (f.number, is_repeated(f)) for f in descriptor.fields}
    assert actual == V1BETA1[message]


def test_v1beta1_types_and_services() -> None:
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(V1BETA1)
    numa = pb.DESCRIPTOR.message_types_by_name["NUMANode"].fields_by_name["ID"]
    assert numa.type == FieldDescriptor.TYPE_INT64
    size = pb.DESCRIPTOR.message_types_by_name["ContainerPreferredAllocationRequest"]
    assert size.fields_by_name["allocation_size"].type == FieldDescriptor.TYPE_INT32
    services = {
        s.full_name: {m.name: (m.server_streaming, m.input_type.name, m.output_type.name)}
        | {n.name: (n.server_streaming, n.input_type.name, n.output_type.name) for n in s.methods}
        for s in pb.DESCRIPTOR.services_by_name.values()
        for m in s.methods[:1]
    }
    assert services["v1beta1.Registration"] == {"Register": (False, "RegisterRequest", "Empty")}
    assert services["v1beta1.DevicePlugin"] == {
        "GetDevicePluginOptions": (False, "Empty", "DevicePluginOptions"),
        "ListAndWatch": (True, "Empty", "ListAndWatchResponse"),
        "GetPreferredAllocation": (
            False,
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
        ),
        "Allocate": (False, "AllocateRequest", "AllocateResponse"),
        "PreStartContainer": (False, "PreStartContainerRequest", "PreStartContainerResponse"),
    }


def test_wire_bytes_match_the_kubelet_encoding() -> None:
    # Field 1 (devices_ids) of field 1 (container_requests): tags 0x0a, 0x0a.
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=["a"])]
    )
    assert request.SerializeToString() == b"\x0a\x03\x0a\x01a"
    cdi = pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name="v.com/c=x")])
    assert cdi.SerializeToString() == b"\x2a\x0b\x0a\x09v.com/c=x"


def test_podresources_v1() -> None:
    assert podres.DESCRIPTOR.package == "v1"
    service = podres.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    devices = podres.DESCRIPTOR.message_types_by_name["ContainerDevices"]
    assert {f.name: f.number for f in devices.fields} == {
        "resource_name": 1,
        "device_ids": 2,
        "topology": 3,
    }
    get = podres.DESCRIPTOR.message_types_by_name["GetPodResourcesRequest"]
    assert {f.name: f.number for f in get.fields} == {"pod_name": 1, "pod_namespace": 2}


def test_constants() -> None:
    assert constants.VERSION == "v1beta1"
    assert constants.DEVICE_PLUGIN_PATH == "/var/lib/kubelet/device-plugins"
    assert constants.KUBELET_SOCKET == "kubelet.sock"
    assert (constants.HEALTHY, constants.UNHEALTHY) == ("Healthy", "Unhealthy")


def test_generated_modules_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "genproto.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_freshness_check_catches_stale_modules(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tools", tmp_path / "tools")
    shutil.copytree(ROOT / "src" / "devplug" / "api", tmp_path / "src" / "devplug" / "api")
    proto = tmp_path / "src" / "devplug" / "api" / "v1beta1" / "api.proto"
    proto.write_text(proto.read_text().replace("string name = 1;", "string name = 7;"))
    result = subprocess.run(
        [sys.executable, str(tmp_path / "tools" / "genproto.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "devplug/api/v1beta1/api_pb2.py" in result.stdout
