"""A missing extra is one line naming the extra to install: each command and config that
needs one runs with the extra's modules made unimportable (as on a base install) and
says `pip install 'devplug[<extra>]'`, no traceback; every extra of pyproject.toml has
such a case, so a new one cannot go untried. What needs no extra (a DRA config's
quantities) works without any."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from devplug.cli import style

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parents[1] / "cli_runner.py"
# Extras that are no feature of devplug itself (test tools).
NOT_FEATURES = {"dev", "envtest"}
# Extras whose absence is no failure: the feature falls back, with a warning.
FALLS_BACK = {"udev": "hot-plug events from udev, else inotify on /dev"}

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: t}}]
"""
FLEET = "pools:\n  - {name: a, config: {resources: [{name: example.com/v, virtual: 1}]}}\n"
WORKLOAD = """apiVersion: v1
kind: Pod
metadata: {name: w}
spec:
  containers: [{name: c, resources: {limits: {example.com/v: 1}}}]
"""
SHARED = """resources:
  - name: example.com/gpu
    virtual: 2
    mode: dra
    dra:
      driver: gpu.example.com
      consumableCapacity:
        memory:
          value: 40Gi
          requestPolicy: {default: 1Gi, validRange: {min: 1Gi, step: 1Gi}}
"""
LABELLED = "resources:\n  - {name: example.com/v, virtual: 1, nodeModeLabel: example.com/mode}\n"


def extras() -> dict[str, list[str]]:
    """The extras of pyproject.toml and the modules their packages give."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    modules = {"pyudev": "pyudev", "kubernetes": "kubernetes", "aiohttp": "aiohttp"}
    found = {}
    for extra, requirements in project["optional-dependencies"].items():
        names = [r.split(">")[0].split("=")[0].split("[")[0] for r in requirements]
        found[extra] = [modules.get(n, n.replace("-", "_")) for n in names]
    return found


@dataclass(frozen=True)
class Case:
    argv: list[str]
    block: list[str]
    extra: str


def cases(tmp: Path) -> dict[str, Case]:
    files = {
        "kubeconfig": KUBECONFIG,
        "fleet.yaml": FLEET,
        "workload.yaml": WORKLOAD,
        "shared.yaml": SHARED,
        "labelled.yaml": LABELLED,
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    kc, fleet = str(tmp / "kubeconfig"), str(tmp / "fleet.yaml")
    (tmp / "dp").mkdir()
    serve = ["serve", "--plugin-dir", str(tmp / "dp"), "--kubeconfig", kc]
    kube = ["--kubeconfig", kc, "--node-name", "n"]
    plan = ["plan", "-f", fleet, "--workload", str(tmp / "workload.yaml")]
    return {
        "serve a DRA config": Case(
            [*serve, "--config", str(tmp / "shared.yaml"), "--registry-dir", str(tmp / "dp")],
            ["aiohttp"],
            "dra",
        ),
        "serve with nodeModeLabel": Case(
            [*serve, "--config", str(tmp / "labelled.yaml")], ["aiohttp"], "dra"
        ),
        "kubelet --kubeconfig": Case(
            ["kubelet", "--plugin-dir", str(tmp / "dp"), "--registry-dir", str(tmp / "dp"), *kube],
            ["aiohttp"],
            "dra",
        ),
        "fleet up, no aiohttp": Case(
            ["fleet", "up", "-f", fleet, "--kubeconfig", kc], ["aiohttp"], "fleet"
        ),
        "fleet down": Case(
            ["fleet", "down", "-f", fleet, "--kubeconfig", kc], ["aiohttp"], "fleet"
        ),
        "plan --kubeconfig": Case([*plan, "--kubeconfig", kc], ["aiohttp"], "fleet"),
        "plan --html": Case([*plan, "--html", str(tmp / "r.html")], ["plotly"], "report"),
    }


def run(jobs: list[dict[str, object]]) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(RUNNER)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    )
    results: list[dict[str, object]] = json.loads(done.stdout)
    return results


def test_every_extra_of_a_feature_has_a_case(short_tmp: Path) -> None:
    covered = {case.extra for case in cases(short_tmp).values()}
    features = set(extras()) - NOT_FEATURES - set(FALLS_BACK)
    assert features == covered, f"extras without a case: {features - covered}"


def test_each_case_blocks_modules_of_its_extra(short_tmp: Path) -> None:
    modules = extras()
    for name, case in cases(short_tmp).items():
        assert set(case.block) <= set(modules[case.extra]), name


def test_a_missing_extra_is_one_line_naming_it(short_tmp: Path) -> None:
    found = cases(short_tmp)
    jobs = [
        {"argv": [*c.argv, "--log-level", "warning"], "block": c.block, "timeout": 60}
        for c in found.values()
    ]
    wrong = []
    for (name, case), result in zip(found.items(), run(jobs), strict=True):
        err = str(result["stderr"])
        lines = err.strip().splitlines()
        hint = f"pip install 'devplug[{case.extra}]'"
        if result["code"] != style.EXIT_FAILED or len(lines) != 1 or hint not in lines[0]:
            wrong.append(f"{name}: exit {result['code']}, {err.strip()!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("command", ["check", "check --device-classes"])
def test_a_dra_config_with_quantities_needs_no_extra(command: str, short_tmp: Path) -> None:
    config = short_tmp / "shared.yaml"
    config.write_text(SHARED)
    [result] = run([{"argv": [*command.split(), "--config", str(config)], "block": ["kubernetes"]}])
    assert result["code"] == 0, result["stderr"]
    assert "Traceback" not in str(result["stderr"])
