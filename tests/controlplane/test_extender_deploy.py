"""The scheduler extender's manifests: deploy/extender (a second kube-scheduler and
`devplug extender` in one pod) and deploy/overlays/gpu-shares (the nodes serving
shares), rendered by the real `kubectl kustomize`, valid for Kubernetes, and agreeing
with each other and with what the code does with the API."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from devplug.cli.main import build_parser
from devplug.sources import parse_config
from tests.controlplane.test_deploy import DEPLOY, KUBERNETES_VERSION, by_kind, config_text, render

SHARES = "overlays/gpu-shares"


def rules(objects: list[dict[str, Any]], account: str) -> set[tuple[str, str]]:
    """(resource, verb) the roles bound to `account` allow."""
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    allowed = set()
    for binding in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        if any(s["name"] == account for s in binding["subjects"]):
            role = roles.get(binding["roleRef"]["name"])
            for rule in role["rules"] if role else []:
                allowed |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    return allowed


def test_every_object_of_the_extender_and_the_shares_overlay_is_valid() -> None:
    import kubernetes_validate

    for variant in ("extender", SHARES):
        for obj in render(variant):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_scheduler_calls_the_extender_beside_it_for_the_nodes_resource() -> None:
    objects = render("extender")
    pod = by_kind(objects, "Deployment")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    args = build_parser().parse_args(containers["extender"]["args"])
    assert (args.command, args.policy, args.address) == ("extender", "fgd", "0.0.0.0")
    probes = {c["livenessProbe"]["httpGet"]["path"]: c for c in pod["containers"]}
    assert containers["extender"]["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": args.port,
    }
    assert probes["/healthz"] is containers["extender"]
    [config_map] = [o for o in objects if o["kind"] == "ConfigMap"]
    scheduler = yaml.safe_load(config_map["data"]["scheduler.yaml"])
    [extender] = scheduler["extenders"]
    assert urlsplit(extender["urlPrefix"]).port == args.port
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["ignorable"] is False
    [profile] = scheduler["profiles"]
    assert profile["schedulerName"] == "devplug-extender"
    [managed] = extender["managedResources"]
    [entry] = parse_config(config_text(render(SHARES)), "gpu-shares").resources
    assert managed == {"name": entry.name, "ignoredByScheduler": False}
    assert entry.nvidia is not None
    assert entry.nvidia.replica_policy == "extender"
    base = yaml.safe_load((DEPLOY / "base/kustomization.yaml").read_text())["images"][0]
    assert containers["extender"]["image"] == f"localhost/devplug:{base['newTag']}"
    # What KubeApi does: list Nodes and pods, read and annotate a pod, bind it.
    allowed = rules(objects, pod["serviceAccountName"])
    wanted = {("nodes", "list"), ("pods", "list"), ("pods", "get"), ("pods", "patch")}
    assert wanted | {("pods/binding", "create")} <= allowed


def test_the_shares_overlay_gives_the_node_side_its_node_a_token_and_its_rights() -> None:
    objects = render(SHARES)
    pod = by_kind(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert pod["automountServiceAccountToken"] is True
    args = build_parser().parse_args(container["args"])
    assert args.kubeconfig is None  # in-cluster
    # What ExtenderAgent does: patch its Node, list the node's pods, annotate one.
    allowed = rules(objects, pod["serviceAccountName"])
    assert {("nodes", "patch"), ("pods", "list"), ("pods", "patch")} <= allowed


def test_the_real_node_test_runs_the_shipped_scheduler_config() -> None:
    from tests.realnode.test_extender_real_node import scheduler_config

    shipped = yaml.safe_load((DEPLOY / "extender/scheduler.yaml").read_text())
    tested = scheduler_config(Path("/k"), 8888)
    assert tested["profiles"] == shipped["profiles"]
    assert tested["extenders"] == shipped["extenders"]
    assert tested["profiles"] == [{"schedulerName": "devplug-extender"}]


def without_labels(obj: dict[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    """What must agree between the chart and kustomize for the extender's objects:
    everything but labels and the Deployment's selector; the scheduler config as data."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("labels", None)
    if obj["kind"] == "Deployment":
        obj["spec"].pop("selector")
        obj["spec"]["template"]["metadata"].pop("labels")
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    return (obj["kind"], obj["metadata"]["name"]), obj


def test_the_charts_extender_renders_what_deploy_extender_renders() -> None:
    pytest.importorskip("helm_python", reason="the Helm SDK comes with the dev group")
    from tests.unit.test_helm import chart_objects

    chart = [
        o
        for o in chart_objects({"extender": {"enabled": True}})
        if "extender" in o["metadata"]["name"] or o["metadata"]["name"] == "devplug-scheduler"
    ]
    helm_side = dict(without_labels(o) for o in chart)
    kustomize_side = dict(without_labels(o) for o in render("extender"))
    assert sorted(helm_side) == sorted(kustomize_side)
    for key, expected in kustomize_side.items():
        assert helm_side[key] == expected, key
    changed = chart_objects({"extender": {"enabled": True, "policy": "bestfit", "port": 9000}})
    [deployment] = [o for o in changed if o["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    args = build_parser().parse_args(containers["extender"]["args"])
    assert (args.policy, args.port) == ("bestfit", 9000)
    assert not [o for o in chart_objects({}) if "extender" in o["metadata"]["name"]]


def test_the_openb_fleet_benchmark_runs_the_shipped_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make fleet-bench` proves the placement of the profile users deploy: its weight,
    which the scheduler's own scores cannot outvote, and every node scored."""
    monkeypatch.syspath_prepend(str(DEPLOY.parent / "bench"))
    from fleet_trace import scheduler_settings

    shipped = yaml.safe_load((DEPLOY / "extender/scheduler.yaml").read_text())
    settings = scheduler_settings("http://127.0.0.1:1")
    [extender] = settings["extenders"]
    [deployed] = shipped["extenders"]
    assert extender == {
        **{k: v for k, v in deployed.items() if k != "managedResources"},
        "urlPrefix": "http://127.0.0.1:1",
    }
    assert settings["percentageOfNodesToScore"] == shipped["percentageOfNodesToScore"] == 100
    assert deployed["weight"] >= 100
