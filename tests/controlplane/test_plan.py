"""`devplug plan`: workloads from YAML and CSV with their one-line errors, capacity runs
with the fit step and with the knobs, the report's figures, the HTML report opened in
headless Chromium, and a run through the real scheduler."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_helpers import cli_command, devplug

from devplug.fleet.spec import parse_fleet
from devplug.plan.engine import run_fit
from devplug.plan.report import report_document, scheduler_reasons, summarize
from devplug.plan.variants import KnobError, parse_vary
from devplug.plan.workload import WorkloadError, parse_csv, parse_yaml

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FLEET = {
    "name": "plan",
    "pools": [
        {
            "name": "h100",
            "count": 2,
            "cpu": 96,
            "memory": "1Ti",
            "taints": [TAINT],
            "topologyPolicy": "single-numa-node",
            "gpus": {"model": "H100-SXM5-80GB", "count": 8, "numaNodes": 2},
            "config": {"resources": [{"nvidia": {}}]},
        },
        {
            "name": "a100",
            "count": 1,
            "cpu": 16,
            "memory": "64Gi",
            "taints": [TAINT],
            "gpus": {
                "model": "A100-SXM4-40GB",
                "count": 2,
                "mig": ["3g.20gb", "2g.10gb", "2g.10gb"],
            },
            "config": {"resources": [{"nvidia": {"migStrategy": "mixed"}}]},
        },
        {
            "name": "cpu",
            "count": 1,
            "cpu": 8,
            "memory": "32Gi",
            "config": {"resources": [{"name": "example.com/none", "virtual": 1}]},
        },
    ],
}
CSV = """name,count,cpu,memory,gpus,gpuShare
train,3,8,64Gi,5,
infer,5,1,4Gi,,0.25
web,4,1,2Gi,,
"""


def fleet() -> Any:
    return parse_fleet(yaml.safe_dump(FLEET), "fleet.yaml")


async def runs(tmp_path: Path, *vary: str) -> dict[str, Any]:
    """The report of the fit step over the workload, once per variant of `vary`."""
    workload = parse_csv(CSV, "pods.csv")
    results = [
        summarize(await run_fit(fleet(), workload, v, tmp_path / str(i)))
        for i, v in enumerate(parse_vary(list(vary)))
    ]
    return report_document("plan", "pods.csv", "fit step", results)


# -- workloads ------------------------------------------------------------------------------


def test_yaml_workloads_expand_counts_jobs_and_replicas() -> None:
    text = """
apiVersion: v1
kind: Pod
metadata: {name: solo, annotations: {devplug.io/count: "3", team: a}}
spec: {containers: [{name: c, image: x}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec:
  parallelism: 2
  template: {spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 1, template: {metadata: {labels: {app: web}}, spec: {containers: [{name: c}]}}}
"""
    workload = parse_yaml(text, "w.yaml")
    names = [p["metadata"]["name"] for p in workload.pods]
    assert names == ["solo-0", "solo-1", "solo-2", "batch-0", "batch-1", "web"]
    assert workload.pods[0]["metadata"]["annotations"] == {"team": "a"}
    assert workload.pods[5]["metadata"]["labels"] == {"app": "web"}
    assert workload.pods[3]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: Service\nmetadata: {name: s}\n", "w.yaml: document 1 (Service s): kind 'Service'"),
        (
            "kind: Job\nmetadata: {name: j}\nspec: {parallelism: many}\n",
            "w.yaml: document 1 (Job j): spec.parallelism: expected a whole number, got 'many'",
        ),
        ("kind: Pod\nspec: {containers: [{name: c}]}\n", "w.yaml: document 1: metadata.name"),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {}\n",
            "w.yaml: document 1 (Pod p): spec.containers",
        ),
    ],
)
def test_a_bad_yaml_workload_names_the_document_and_field(text: str, expected: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        parse_yaml(text, "w.yaml")
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name,colour\na,red\n", "pods.csv: column 'colour': expected columns among"),
        ("cpu,gpus\nlots,1\n", "pods.csv: row 2: cpu: quantities must match"),
        ("gpus,gpuShare\n1,0.5\n", "pods.csv: row 2: gpus and gpuShare: a pod asks for one"),
        ("gpuShare\n1.5\n", "pods.csv: row 2: gpuShare: expected a number between 0 and 1"),
        ("name,count\na,1\na,1\n", "pods.csv: pod 'a' comes twice"),
    ],
)
def test_a_bad_csv_names_the_row_and_column(text: str, expected: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        parse_csv(text, "pods.csv")
    assert str(caught.value).startswith(expected)


def test_a_bad_knob_is_refused() -> None:
    with pytest.raises(KnobError, match="unknown knob 'colour'"):
        parse_vary(["colour=red"])
    with pytest.raises(KnobError, match="replicas: expected 1 to 256"):
        parse_vary(["replicas=0"])
    assert [v.name for v in parse_vary(["replicas=2,4", "mode=dra"])] == [
        "baseline",
        "replicas=2",
        "replicas=4",
        "mode=dra",
    ]


# -- capacity runs --------------------------------------------------------------------------


async def test_the_fit_step_run_reports_devices_pods_and_reasons(tmp_path: Path) -> None:
    document = await runs(tmp_path, "topologyPolicy=none")
    baseline, relaxed = document["runs"]
    # 5 GPUs of 8 on two NUMA nodes: single-numa-node fails every training pod on the
    # node the scheduler picked (it counts GPUs only), as a kubelet would.
    assert baseline["kubelet_reasons"] == {
        "TopologyAffinityError": {
            "pods": 3,
            "message": "Resources cannot be allocated with Topology locality",
        }
    }
    # ...so the H100s are all free, and stranded: the pod left pending wants a MIG device.
    assert baseline["pools"]["h100"]["devices"]["nvidia.com/gpu"] == {
        "capacity": 16,
        "used": 0,
        "free": 16,
        "stranded": 16,
    }
    # A quarter of an A100 40GB is its 2g.10gb MIG device.
    infer = [p for p in baseline["pods"] if p["pod"].startswith("infer")]
    assert {p["pool"] for p in infer if p["phase"] == "Running"} == {"a100"}
    assert baseline["pools"]["a100"]["devices"]["nvidia.com/mig-2g.10gb"]["used"] == 4
    [pending] = [p for p in infer if p["phase"] == "Pending"]
    assert pending["message"] == "0/4 nodes are available: 4 Insufficient nvidia.com/mig-2g.10gb."
    assert baseline["pending_reasons"] == {
        "Insufficient nvidia.com/mig-2g.10gb": {
            "pods": 1,
            "messages": 1,
            "example": pending["message"],
        }
    }
    web = [p for p in baseline["pods"] if p["pod"].startswith("web")]
    assert {(p["phase"], p["pool"]) for p in web} == {("Running", "cpu")}
    # Without the topology manager two of the three fit (5 of 8 GPUs each); the third
    # is pending, and the 3 GPUs left on each H100 node are stranded: no pending pod fits.
    assert relaxed["overall"]["pods"] == {"Running": 10, "Failed": 0, "Pending": 2}
    assert relaxed["pools"]["h100"]["devices"]["nvidia.com/gpu"] == {
        "capacity": 16,
        "used": 10,
        "free": 6,
        "stranded": 6,
    }
    assert [c["variant"] for c in document["comparison"]] == ["baseline", "topologyPolicy=none"]
    assert relaxed["timeline"][-1]["h100"] == 10
    assert len(relaxed["timeline"]) == 12


async def test_time_slicing_and_dra_change_the_answer(tmp_path: Path) -> None:
    document = await runs(tmp_path, "replicas=4", "mode=dra")
    by_run = {r["variant"]: r for r in document["runs"]}
    sliced = by_run["replicas=4"]
    assert sliced["pools"]["h100"]["devices"]["nvidia.com/gpu"]["capacity"] == 64
    assert sliced["overall"]["pods"]["Failed"] == 0  # 5 replicas fit on one NUMA node
    # The 64 units are replicas of 16 GPUs: reported as units on devices, not capacity.
    h100 = sliced["shared"]["h100"]["nvidia.com/gpu"]
    assert (h100["units"], h100["devices"]) == (64, 16)
    assert h100["units_used"] == 15
    assert 3 <= h100["devices_in_use"] <= 15
    assert "h100" not in by_run["baseline"]["shared"]
    compared = {c["variant"]: c for c in document["comparison"]}
    assert compared["replicas=4"]["devices"]["nvidia.com/gpu"]["physical"]["devices"] == 16
    assert "physical" not in compared["baseline"]["devices"]["nvidia.com/gpu"]
    dra = by_run["mode=dra"]
    assert "dra:gpu.nvidia.com" in dra["pools"]["h100"]["devices"]
    trains = [p for p in dra["pods"] if p["pod"].startswith("train")]
    # Claims are allocated whole by the scheduler side; no topology manager refusal.
    assert {p["phase"] for p in trains} <= {"Running", "Pending"}
    assert dra["pools"]["h100"]["devices"]["dra:gpu.nvidia.com"]["used"] == 15


async def test_the_fit_step_sees_the_node_labels_the_api_server_has(tmp_path: Path) -> None:
    # The labels every registered node carries (kubernetes.io/os, kubernetes.io/arch)
    # match a nodeSelector in the fit step as they do for the real scheduler.
    workload = parse_yaml(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "web"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}
                    ],
                },
            }
        ),
        "pods.yaml",
    )
    [variant] = parse_vary([])
    run = await run_fit(fleet(), workload, variant, tmp_path)
    assert [(p.phase, p.pool) for p in run.pods] == [("Running", "cpu")]


def test_pending_pods_are_classed_by_the_reason_most_nodes_gave() -> None:
    from devplug.plan.report import reason_class

    assert reason_class("0/9 nodes are available: 2 Insufficient cpu, 7 Too many pods.") == (
        "Too many pods"
    )
    assert reason_class("no message the scheduler writes") == "pending"


def test_scheduler_messages_are_read_as_reasons_per_node() -> None:
    found = scheduler_reasons(
        "0/5 nodes are available: 1 Insufficient cpu, 4 node(s) had untolerated taint "
        "{a: b}. preemption: 0/5 nodes are available: 5 No preemption victims found."
    )
    assert dict(found) == {"Insufficient cpu": 1, "node(s) had untolerated taint {a: b}": 4}


def test_plan_says_which_placement_it_used(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    (tmp_path / "pods.csv").write_text(CSV)
    command = cli_command("plan", "-f", str(tmp_path / "fleet.yaml"))
    done = subprocess.run(
        [*command, "--workload", str(tmp_path / "pods.csv")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith(
        f"capacity of plan for {tmp_path / 'pods.csv'} (placement: fit step)"
    )
    bad = subprocess.run(
        [*command, "--workload", str(tmp_path / "missing.csv")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr == (
        f"devplug plan: argument --workload: {tmp_path / 'missing.csv'}: no such file "
        "(see 'devplug plan --help')\n"
    )


# -- the HTML report in a browser --------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
    "--dump-dom",
]
CONSOLE_ERROR = re.compile(r"CONSOLE.*?\] \"(Uncaught [^\"]*|[^\"]*Error[^\"]*)\"")


def open_in_chromium(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran, and the errors of its console."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (`make test` installs Debian's chromium)")
    done = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(profile)},
    )
    return done.stdout, CONSOLE_ERROR.findall(done.stderr)


def test_thirty_pools_get_thirty_colours_and_a_legend_that_grows_below() -> None:
    import plotly.graph_objects as go

    from devplug.plan.plotstyle import legend_below, palette

    assert len(set(palette(30))) == 30
    assert len(set(palette(48))) == 48
    figure = go.Figure()
    legend_below(figure, 60)
    assert figure.layout.legend.orientation == "h"
    assert figure.layout.height > 600  # 15 rows of legend below the plot, not over it


@pytest.fixture
async def four_replicas(tmp_path: Path) -> dict[str, Any]:
    """The report of the fit step with 4 replicas of each shared GPU."""
    return await runs(tmp_path / "runs", "replicas=4")


def test_the_html_report_renders_its_plots_without_console_errors(
    tmp_path: Path, four_replicas: dict[str, Any]
) -> None:
    from devplug.plan.html import report_html

    page = tmp_path / "report.html"
    page.write_text(report_html(four_replicas))
    assert "https://" not in page.read_text().split("<pre>")[0].split("plotly.js v")[0][:200]
    dom, errors = open_in_chromium(page, tmp_path / "profile")
    assert errors == []
    # plotly draws each figure as an SVG of class main-svg inside its div
    for index in range(3):
        block = dom.split(f'id="plot-{index}"')[1].split('id="plot-')[0]
        assert 'class="main-svg"' in block, f"plot {index} not drawn"
    assert dom.count('class="trace bars"') >= 2

    # The same check catches a page whose script fails: the test can fail.
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, errors = open_in_chromium(broken, tmp_path / "profile2")
    assert errors
    assert "undefinedFunction" in errors[0]


# -- the real scheduler --------------------------------------------------------------------------


def test_plan_with_a_kubeconfig_uses_the_real_scheduler(kubeconfig: str, tmp_path: Path) -> None:
    small = {
        "name": "plan-live",
        "pools": [
            {
                "name": "live",
                "count": 2,
                "cpu": 8,
                "memory": "16Gi",
                "topologyPolicy": "single-numa-node",
                "config": {
                    "resources": [
                        {
                            "name": "example.com/acc",
                            "groups": [
                                {"paths": [{"path": "/dev/null"}], "numaNode": 0},
                                {"paths": [{"path": "/dev/zero"}], "numaNode": 1},
                            ],
                        }
                    ]
                },
            }
        ],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(small))
    pods = "\n---\n".join(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": {"devplug.io/count": str(count)}},
                "spec": {
                    "nodeSelector": {"devplug.io/fleet": "plan-live"},
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"example.com/acc": n}}}
                    ],
                },
            }
        )
        for name, count, n in (("pair", 1, 2), ("one", 3, 1))
    )
    (tmp_path / "pods.yaml").write_text(pods)
    done = devplug(
        "plan",
        "-f",
        str(tmp_path / "fleet.yaml"),
        "--workload",
        str(tmp_path / "pods.yaml"),
        "--kubeconfig",
        kubeconfig,
        "-o",
        "json",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["engine"] == "kube-scheduler"
    [run] = document["runs"]
    by_pod = {p["pod"]: p for p in run["pods"]}
    # The real scheduler counts two devices on a node; its kubelet stand-in refuses
    # them across two NUMA nodes.
    assert (by_pod["pair"]["phase"], by_pod["pair"]["reason"]) == (
        "Failed",
        "TopologyAffinityError",
    )
    assert sorted(by_pod[f"one-{i}"]["phase"] for i in range(3)) == ["Running"] * 3
    assert run["pools"]["live"]["devices"]["example.com/acc"]["used"] == 3
    # The run removed what it made: no node of the fleet is left.
    left = devplug(
        "fleet",
        "down",
        "-f",
        str(tmp_path / "fleet.yaml"),
        "--kubeconfig",
        kubeconfig,
        "-o",
        "json",
    )
    assert left.returncode == 0, left.stderr
    assert json.loads(left.stdout)["nodes"] == 0


def test_the_worked_question_in_the_docs_is_what_plan_answers(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "fleet.md").read_text()
    worked = page.split("### A worked question", 1)[1]
    fleet_text, csv_text, shown = re.findall(r"```(?:yaml)?\n(.*?)```", worked, re.S)[:3]
    (tmp_path / "fleet.yaml").write_text(fleet_text)
    (tmp_path / "pods.csv").write_text(csv_text)
    done = devplug(
        "plan",
        "-f",
        "fleet.yaml",
        "--workload",
        "pods.csv",
        "--vary",
        "topologyPolicy=none",
        "--vary",
        "replicas=2",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


def test_plan_and_fleet_check_run_for_a_user_who_is_not_root() -> None:
    """The worked question as `nobody` (no mknod: the fake GPU hosts' device nodes are
    plain files then), the same answer; `fleet check` of the same fleet."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "fleet.md").read_text()
    worked = page.split("### A worked question", 1)[1]
    fleet_text, csv_text, shown = re.findall(r"```(?:yaml)?\n(.*?)```", worked, re.S)[:3]
    user = "nobody" if os.geteuid() == 0 else None  # not root already: as this user
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        os.chmod(folder, 0o755)
        (Path(folder) / "fleet.yaml").write_text(fleet_text)
        (Path(folder) / "pods.csv").write_text(csv_text)
        varied = ("--vary", "topologyPolicy=none", "--vary", "replicas=2")
        args = ("plan", "-f", "fleet.yaml", "--workload", "pods.csv", *varied)
        done = devplug(*args, cwd=Path(folder), user=user)
        assert done.returncode == 0, done.stderr
        assert done.stdout == shown
        checked = devplug("fleet", "check", "-f", "fleet.yaml", cwd=Path(folder), user=user)
        assert checked.returncode == 0, checked.stderr
        assert "pool h100: 4 nodes" in checked.stdout
