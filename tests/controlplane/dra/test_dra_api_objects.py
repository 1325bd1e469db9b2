"""What devplug ships and publishes, as the API server judges it (no daemon): the
deploy RBAC grants what the driver does and no more, the shipped and documented objects
are accepted, every slice a config publishes is accepted, and each request policy the
config check refuses the API server refuses too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.dra_cluster_helpers import ROOT
from tests.dra_helpers import DRIVER

USER = "system:serviceaccount:devplug-system:devplug"


def allowed(api: Any, group: str, resource: str, verb: str, name: str = "") -> bool:
    """Whether the API server lets the deploy's service account do `verb` on `resource`."""
    from kubernetes import client

    resource, _, subresource = resource.partition("/")
    attributes = {"group": group, "resource": resource, "verb": verb}
    if subresource:
        attributes["subresource"] = subresource
    if name:
        attributes["name"] = name
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": USER, "resourceAttributes": attributes},
        }
    )
    return bool(review.status.allowed)


def test_the_shipped_device_classes_and_driver_role_are_accepted(
    api: Any, deploy_rbac: None
) -> None:
    """The component's DeviceClasses and the drivers' role (CEL, extendedResourceName),
    in a dry run."""
    import yaml
    from kubernetes import utils

    dra = ROOT / "deploy" / "dra"
    for path in (dra / "component" / "deviceclasses.yaml", dra / "drivers.yaml"):
        objects = list(yaml.safe_load_all(path.read_text()))
        for obj in objects:  # the fixture made the test drivers' role of that name
            if obj["kind"] == "ClusterRole":
                obj["metadata"]["name"] += "-shipped"
        utils.create_from_yaml(api, yaml_objects=objects, dry_run="All")


def test_the_deploy_rbac_grants_what_the_driver_does(api: Any, deploy_rbac: None) -> None:
    for verb in ("list", "watch", "create", "update", "delete"):
        assert allowed(api, "resource.k8s.io", "resourceslices", verb), verb
    assert allowed(api, "resource.k8s.io", "resourceclaims", "get")
    assert allowed(api, "resource.k8s.io", "resourceclaims/status", "patch")
    assert allowed(api, "resource.k8s.io", "resourceclaims/driver", "associated-node:patch", DRIVER)
    assert allowed(api, "", "nodes", "get")


def test_the_deploy_rbac_grants_no_more(api: Any, deploy_rbac: None) -> None:
    """Claim status only for its own drivers, from its own node."""
    assert not allowed(
        api, "resource.k8s.io", "resourceclaims/driver", "associated-node:patch", "x.io"
    )
    assert not allowed(
        api, "resource.k8s.io", "resourceclaims/driver", "arbitrary-node:patch", DRIVER
    )
    assert not allowed(api, "resource.k8s.io", "resourceclaims/status", "update")
    assert not allowed(api, "resource.k8s.io", "resourceclaims", "update")
    assert not allowed(api, "", "pods", "list")
    assert not allowed(api, "", "secrets", "get")


def test_doc_examples_are_accepted_by_the_api_server(api: Any, namespace: str) -> None:
    """The DeviceClasses, claims, templates and pods of docs/dra.md pass the API
    server's validation (CEL compiled), in a dry run."""
    from kubernetes import client

    from tests.unit.test_dra_docs import manifests

    resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    create = {
        "DeviceClass": lambda body: resource.create_device_class(body, dry_run="All"),
        "ResourceClaim": lambda body: resource.create_namespaced_resource_claim(
            namespace, body, dry_run="All"
        ),
        "ResourceClaimTemplate": lambda body: resource.create_namespaced_resource_claim_template(
            namespace, body, dry_run="All"
        ),
        "Pod": lambda body: core.create_namespaced_pod(namespace, body, dry_run="All"),
    }
    objects = manifests()
    assert {o["kind"] for o in objects} == set(create)
    for body in objects:
        create[body["kind"]](body)


# -- the truth about field names and limits is the API server's -------------------------


def refusal(api: Any, body: dict[str, Any]) -> str | None:
    """Why the API server refuses the slice `body` (status and message), in a dry run."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ResourceV1Api(api).create_resource_slice(body, dry_run="All")
    except ApiException as error:
        return f"{error.status} {json.loads(error.body)['message']}"
    return None


def bodies(dra: dict[str, Any], cards: int = 1, sick: bool = False) -> list[dict[str, Any]]:
    """The slices a config with this `dra` block publishes for `cards` cards."""
    import yaml

    from devplug.framework.dra.slices import slice_bodies
    from devplug.sources import build_plugins, parse_config
    from devplug.sources.dradriver import config_driver

    groups = [
        {"id": f"card{i}", "paths": [{"path": "/dev/null"}], "attributes": {"memory": 8 << 30}}
        for i in range(cards)
    ]
    entry = {"name": "example.com/card", "mode": "dra", "dra": dra, "groups": groups}
    [plugin] = build_plugins(parse_config(yaml.safe_dump({"resources": [entry]})))
    plugin.publish(plugin.discover())
    if sick:  # tainted, its value made of the reason
        plugin.set_health("card0", False, "Xid 79, needs a reset")
    return slice_bodies(config_driver(plugin), "api-check", 1)


def test_every_slice_a_partitioned_or_shared_config_publishes_is_accepted(api: Any) -> None:
    """A pool of 20 partitioned cards too, in six slices, and a tainted device of each
    taint effect."""
    from devplug.framework.dra.driver import TAINT_EFFECTS

    regions = {
        "counters": {"left": 4, "right": 4},
        "devices": [
            {"name": "left", "consumes": {"left": 4}, "env": {"REGION": "left"}},
            {"name": "quarter", "consumes": {"left": 1, "right": 1}},
            {"name": "whole", "consumes": {"left": 4, "right": 4}},
        ],
    }
    accepted = [
        *bodies({"partitions": {"slots": 32, "sizes": [1, 2, 4, 8, 16, 32]}}, cards=20),
        *bodies({"partitions": regions}),
        *bodies({"consumableCapacity": {"memory": {}}}),
        *(b for e in TAINT_EFFECTS for b in bodies({"taintEffect": e}, sick=True)),
    ]
    tainted = [d for b in accepted for d in b["spec"].get("devices") or [] if "taints" in d]
    assert len(tainted) == len(TAINT_EFFECTS)
    assert len(accepted) > 20
    assert [refusal(api, b) for b in accepted] == [None] * len(accepted)


POLICIES = [  # (request policy, what devplug's config check says, or None: accepted)
    ({"default": "10G", "validValues": ["10G", "25G", "50G"]}, None),
    ({"default": "1G", "validRange": {"min": "1G", "max": "9G", "step": "2G"}}, None),
    ({"default": "5G"}, None),
    ({"default": "5G", "validValues": ["10G", "25G"]}, "is not one of the valid values"),
    ({"default": "10G", "validValues": ["25G", "10G"]}, "distinct and in ascending order"),
    ({"default": "10G", "validValues": ["10G", "10G"]}, "distinct and in ascending order"),
    ({"default": "10G", "validValues": ["10G", "200G"]}, "'200G' is more than the capacity"),
    (
        {"default": "10G", "validValues": [f"{i}G" for i in range(10, 21)]},
        "more than 10 values",
    ),
    ({"default": "2G", "validRange": {"min": "1G", "step": "2G"}}, "not min plus a number"),
    ({"default": "1G", "validRange": {"min": "2G"}}, "outside the valid range"),
    ({"default": "200G", "validRange": {"min": "200G"}}, "is more than the capacity"),
    ({"default": "1G", "validRange": {"min": "1G", "max": "4G", "step": "2G"}}, "number of steps"),
    ({"default": "95G", "validRange": {"min": "95G", "step": "10G"}}, "min plus one step"),
    (
        {"default": "10G", "validValues": ["10G"], "validRange": {"min": "1G"}},
        "both 'validValues' and 'validRange'",
    ),
]


@pytest.mark.parametrize(("policy", "problem"), POLICIES)
def test_the_api_server_refuses_the_request_policies_the_config_refuses(
    api: Any, policy: dict[str, Any], problem: str | None
) -> None:
    from devplug.sources import ConfigError

    capacity = {"bandwidth": {"value": "100G", "requestPolicy": policy}}
    try:
        bodies({"consumableCapacity": capacity})
        said = None
    except ConfigError as error:
        said = str(error)
    device = {"name": "card0", "allowMultipleAllocations": True, "capacity": capacity}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "api-check"},
        "spec": {
            "driver": "card.example.com",
            "nodeName": "api-check",
            "pool": {"name": "api-check", "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }
    refused = refusal(api, body)
    if problem is None:
        assert (said, refused) == (None, None), policy
    else:
        assert said is not None, policy
        assert problem in said
        assert refused is not None, policy
        assert refused.startswith("422 "), refused
