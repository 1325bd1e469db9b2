"""The cluster objects a set of drivers needs: the DeviceClass of each (what a claim
names in `deviceClassName`, and, with an extended resource name, what lets a pod ask
for the devices by count), and the ClusterRole that lets them write claim status.

With `extendedResourceName: devplug.io/null`, a pod whose container asks
`devplug.io/null: 1` (and has no claim) is given a device through DRA on every node
whose allocatable does not list that name as a device plugin's: the scheduler makes
a claim for the pod from this class and the kubelet prepares it through the driver.
"""

from __future__ import annotations

from typing import Any

from devplug.api.dra.constants import RESOURCE_API_VERSION


def device_class(driver: str, extended_resource_name: str | None = None) -> dict[str, Any]:
    """The DeviceClass named after `driver` that selects every device of the driver."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": spec,
    }


# The ClusterRole for the drivers' claim status; deploy/dra/component binds it.
STATUS_ROLE = "devplug-dra-drivers"


def driver_status_role(drivers: list[str]) -> dict[str, Any]:
    """The RBAC that Kubernetes 1.36 asks of a node-local driver writing `status.devices`
    of claims (the synthetic subresource resourceclaims/driver, per driver name, with
    the node-aware verb: the API server also checks that the device is on the
    writer's node)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": STATUS_ROLE},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "verbs": ["associated-node:patch"],
                "resourceNames": sorted(drivers),
            }
        ],
    }
