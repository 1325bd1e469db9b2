"""The chart's monitoring values render the objects of deploy/components/monitoring:
the same PodMonitor (selecting the release's pods), alert rules and dashboard."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.process.test_monitoring_objects import operator_problems, render

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "deploy" / "components" / "monitoring"
CHART = ROOT / "deploy" / "helm" / "devplug"
KINDS = {"PodMonitor", "PrometheusRule", "ConfigMap"}
ALL_ON = {
    "monitoring": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}

pytest.importorskip("helm_python", reason="the Helm SDK comes with the dev group")


def chart_monitoring(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The chart's monitoring objects (release `devplug`) by kind."""
    from tests.unit.test_helm import chart_objects

    objects = chart_objects(values)
    found = {
        o["kind"]: o
        for o in objects
        if o["kind"] in KINDS
        and not (o["kind"] == "ConfigMap" and "dashboard" not in o["metadata"]["name"])
    }
    return found


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """All but what each tree sets its own way: the labels of the object (Helm's own,
    and the release's) and the PodMonitor's selector (the release's pods)."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"].pop("labels", {})
    if obj["kind"] == "ConfigMap":
        obj["metadata"]["labels"] = {"grafana_dashboard": labels["grafana_dashboard"]}
    if obj["kind"] == "PodMonitor":
        obj["spec"].pop("selector")
    return obj


def test_the_chart_files_are_the_components_files() -> None:
    for name in ("podmonitor.yaml", "prometheusrule.yaml", "devplug-dashboard.json"):
        assert (CHART / "files" / name).read_text() == (COMPONENT / name).read_text(), name


def test_the_charts_monitoring_objects_are_the_components() -> None:
    chart = chart_monitoring(ALL_ON)
    component = {
        o["kind"]: o
        for o in render("components/monitoring")
        if o["kind"] in KINDS and o["metadata"]["name"] != "devplug-config"
    }
    assert set(chart) == KINDS
    for kind in KINDS:
        assert comparable(chart[kind]) == comparable(component[kind]), kind
        if kind != "ConfigMap":
            assert operator_problems(chart[kind]) == ""


def test_the_monitoring_objects_are_off_by_default_and_each_has_its_value() -> None:
    assert chart_monitoring({}) == {}
    for key, kind in (
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
        ("dashboard", "ConfigMap"),
    ):
        labels = {"release": "kube-prometheus-stack"}
        values = {"monitoring": {key: {"enabled": True, "labels": labels}}}
        only = chart_monitoring(values)
        assert set(only) == {kind}
        assert only[kind]["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_pod_monitor_selects_the_releases_pods_at_its_interval() -> None:
    from tests.unit.test_helm import chart_objects

    values = {"monitoring": {"podMonitor": {"enabled": True, "interval": "15s"}}}
    objects = chart_objects(values, "other")
    [monitor] = [o for o in objects if o["kind"] == "PodMonitor"]
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "other"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == "15s"
    assert operator_problems(monitor) == ""
