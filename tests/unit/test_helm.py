"""The Helm chart, without a helm binary: rendered and linted by the Helm SDK itself
(helm-python-sdk), its values checked against values.schema.json, every object
validated against the Kubernetes schemas, and each variant compared with the kustomize
variant it mirrors, so that the two cannot drift apart."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.cli.main import build_parser
from devplug.kube.tolerations import tolerates
from tests.controlplane.test_deploy import KUBERNETES_VERSION, by_kind, render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "devplug"
NAMESPACE = "devplug-system"
# kustomize variant -> (the chart's values file, the release name that gives its names)
VARIANTS = {
    "": (None, "devplug"),
    "overlays/gpu": ("gpu", "devplug-gpu"),
    "overlays/gpu-per-node": ("gpu-per-node", "devplug-gpu"),
    "overlays/gpu-shares": ("gpu-shares", "devplug-gpu"),
    "dra": ("dra", "devplug"),
}

helm = pytest.importorskip("helm_python", reason="the Helm SDK comes with the dev group")


def variant_values(name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    values: dict[str, Any] = yaml.safe_load((CHART / "variants" / f"{name}.yaml").read_text())
    return values


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_objects(values: dict[str, Any], release: str = "devplug") -> list[dict[str, Any]]:
    """The chart rendered by the Helm SDK (as `helm template`): its objects."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=release, namespace=NAMESPACE, is_install=True)
    return [o for text in manifests.values() for o in yaml.safe_load_all(text) if o]


def of_variant(variant: str, **extra: Any) -> list[dict[str, Any]]:
    name, release = VARIANTS[variant]
    return chart_objects(merge(variant_values(name), extra), release)


def container_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = by_kind(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def named(name: str) -> str:
    """A name as both trees would spell it for one set-up: the kustomize GPU overlay
    suffixes its names with -gpu (to run beside the base), a release named devplug-gpu
    prefixes them."""
    return name.replace("-gpu", "") if name.startswith("devplug") else name


def normalised(obj: dict[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    """What must agree between the chart and kustomize: every field but the labels
    (each tree labels and selects its pods its own way), with names as `named` spells
    them and lists of named items as maps."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["name"] = named(meta["name"])
    labels = meta.pop("labels", {})
    if obj["kind"] == "Namespace":
        meta["labels"] = {k: v for k, v in labels.items() if k.startswith("pod-security")}
    if obj["kind"] == "DaemonSet":
        spec = obj["spec"]
        spec.pop("selector")
        spec["template"]["metadata"].pop("labels")
        pod = spec["template"]["spec"]
        pod["serviceAccountName"] = named(pod["serviceAccountName"])
        pod["volumes"] = {v.pop("name"): v for v in pod["volumes"]}
        for volume in pod["volumes"].values():
            if "configMap" in volume:
                volume["configMap"]["name"] = named(volume["configMap"]["name"])
        for container in pod["containers"]:
            if not container.get("ports"):  # kustomize's DRA patch leaves `ports: []`
                container.pop("ports", None)
            container["env"] = {e.pop("name"): e for e in container.get("env", [])}
            container["volumeMounts"] = {m.pop("name"): m for m in container["volumeMounts"]}
        pod["containers"] = {c.pop("name"): c for c in pod["containers"]}
    if obj["kind"] == "ClusterRoleBinding":
        obj["roleRef"]["name"] = named(obj["roleRef"]["name"])
        for subject in obj["subjects"]:
            subject["name"] = named(subject["name"])
    return (obj["kind"], meta["name"]), obj


def compared(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found = dict(normalised(o) for o in objects)
    assert len(found) == len(objects), "two objects of one kind and name"
    return found


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_renders_what_its_kustomize_variant_renders(variant: str) -> None:
    """Same kinds and names, and in each object the same fields: the DaemonSet's
    containers, args, env, probes, resources, security, volumes, tolerations and
    selection of nodes, the configs, the RBAC and the DeviceClasses."""
    helm_side = compared(of_variant(variant, namespace={"create": True}))
    kustomize_side = compared(render(variant))
    assert sorted(helm_side) == sorted(kustomize_side)
    for key, expected in kustomize_side.items():
        assert helm_side[key] == expected, key


def test_the_comparison_sees_a_difference() -> None:
    """A chart whose DaemonSet differs in one argument does not pass for the kustomize
    tree."""
    helm_side = compared(of_variant("", namespace={"create": True}, extraArgs=["--sysfs-root=/x"]))
    kustomize_side = compared(render(""))
    key = ("DaemonSet", "devplug")
    assert helm_side[key] != kustomize_side[key]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_lints_clean(variant: str) -> None:
    """`helm lint --strict` (the SDK's): no error, no warning."""
    name, _ = VARIANTS[variant]
    report = helm.lint(CHART, variant_values(name), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def schema() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return found


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_values_are_valid_for_the_schema(variant: str) -> None:
    """The values as an install would use them (the chart's defaults merged with the
    variant's), by jsonschema and by Helm's own check."""
    import jsonschema

    name, _ = VARIANTS[variant]
    with helm.Chart.load(CHART) as chart:
        merged = chart.merge_values(variant_values(name))
        chart.validate_schema(variant_values(name))
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(merged)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"metricsPort": "9477"}, "metricsPort"),
        ({"imagee": {}}, "imagee"),
        ({"tolerations": [{"operator": "Exists", "effect": "NoScheduled"}]}, "effect"),
        ({"monitoring": {"podMonitor": {"enabled": "yes"}}}, "enabled"),
        ({"gpu": {"enabled": True, "nvidiaConfigs": {"bad name": "x"}}}, "bad name"),
    ],
)
def test_the_schema_refuses_bad_values(values: dict[str, Any], where: str) -> None:
    """Refused by the schema before anything is rendered, naming the key."""
    import jsonschema

    with helm.Chart.load(CHART) as chart:
        merged = chart.merge_values(values)
        with pytest.raises(helm.HelmValuesError, match=where):
            chart.validate_schema(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema()).validate(merged)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_object_is_valid_for_kubernetes(variant: str) -> None:
    import kubernetes_validate

    for obj in of_variant(variant, namespace={"create": True}):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_chart_is_versioned_as_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version
    assert container_of(of_variant(""))["image"] == f"localhost/devplug:{version}"


def test_the_image_is_never_pulled_unless_a_registry_is_named() -> None:
    container = container_of(of_variant(""))
    assert container["image"].startswith("localhost/")
    assert container["imagePullPolicy"] == "Never"
    pulled = container_of(
        of_variant(
            "",
            image={"repository": "registry.example/devplug", "tag": "7", "pullPolicy": "Always"},
            imagePullSecrets=[{"name": "pull"}],
        )
    )
    assert (pulled["image"], pulled["imagePullPolicy"]) == ("registry.example/devplug:7", "Always")


def test_without_namespace_create_the_release_namespace_is_used_as_it_is() -> None:
    objects = of_variant("")
    assert not [o for o in objects if o["kind"] == "Namespace"]
    assert {o["metadata"].get("namespace") for o in objects} == {NAMESPACE}


def test_values_reach_the_daemonset_as_they_say() -> None:
    objects = of_variant(
        "",
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "fpga"}],
        nodeSelector={"devplug.io/serve": "yes"},
        priorityClassName="",
        resources={"limits": {"memory": "1Gi"}},
        metricsPort=9500,
        extraArgs=["--sysfs-root=/host/sys"],
        extraEnv=[{"name": "GRPC_VERBOSITY", "value": "debug"}],
        podAnnotations={"example.com/team": "devices"},
        fullnameOverride="plugins",
    )
    daemonset = by_kind(objects, "DaemonSet")
    assert daemonset["metadata"]["name"] == "plugins"
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "fpga"}]
    assert not tolerates(pod["tolerations"], {"key": "nvidia.com/gpu", "effect": "NoSchedule"})
    # Helm merges a map of values into the default one.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "devplug.io/serve": "yes"}
    assert "priorityClassName" not in pod
    assert template["metadata"]["annotations"]["example.com/team"] == "devices"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9500"
    [container] = pod["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    }
    args = build_parser().parse_args(container["args"])
    assert (args.metrics_port, args.sysfs_root) == (9500, "/host/sys")
    assert container["ports"][0]["containerPort"] == 9500
    assert {"name": "GRPC_VERBOSITY", "value": "debug"} in container["env"]
    assert by_kind(objects, "ConfigMap")["metadata"]["name"] == "plugins-config"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_reaches_tainted_device_nodes(variant: str) -> None:
    pod = by_kind(of_variant(variant), "DaemonSet")["spec"]["template"]["spec"]
    for effect in ("NoSchedule", "NoExecute"):
        assert tolerates(
            pod["tolerations"], {"key": "dedicated", "value": "fpga", "effect": effect}
        )


def test_the_gpu_variants_select_nodes_as_nvidias_chart_and_an_affinity_replaces_it() -> None:
    pod = by_kind(of_variant("overlays/gpu"), "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert keys == ["feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"]
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    pod = by_kind(of_variant("overlays/gpu", affinity=own), "DaemonSet")["spec"]["template"]
    assert pod["spec"]["affinity"] == own


def test_the_monitoring_toggles_are_values_off_by_default() -> None:
    with helm.Chart.load(CHART) as chart:
        monitoring = chart.values["monitoring"]
    assert monitoring["podMonitor"]["enabled"] is False
    assert monitoring["prometheusRule"]["enabled"] is False
    assert monitoring["dashboard"]["enabled"] is False
    assert set(schema()["properties"]["monitoring"]["properties"]) == {
        "podMonitor",
        "prometheusRule",
        "dashboard",
    }
