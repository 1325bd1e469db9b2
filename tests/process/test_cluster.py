"""`devplug cluster`: the scheduler's fit step, placement across simulated nodes (each a
kubelet simulator with a real `devplug serve` process), admission results, output
forms, bad input, the GPU scenario end to end and cleanup on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_helpers import cli_command, pod, pods_yaml

from devplug.cli.main import build_parser
from devplug.cluster import NodeState, effective_requests, fit_error, schedule
from devplug.simulator.pods import PodSpec, parse_pods

FOO = "example.com/foo"
BAR = "example.com/bar"
GPU = "nvidia.com/gpu"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Per node: foo on /dev/null (NUMA 0) and /dev/zero (NUMA 1), one virtual bar.
CONFIG = {
    "resources": [
        {
            "name": FOO,
            "groups": [
                {"paths": [{"path": "/dev/null"}], "numaNode": 0},
                {"paths": [{"path": "/dev/zero"}], "numaNode": 1},
            ],
        },
        {"name": BAR, "virtual": 1},
    ]
}


def spec(manifest: dict[str, Any]) -> PodSpec:
    [parsed] = parse_pods(manifest)
    assert isinstance(parsed, PodSpec)
    return parsed


def cluster_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`devplug cluster ARGV` in this process (no logging set-up); code, stdout, stderr."""
    try:
        args = build_parser().parse_args(["cluster", *argv])
        code: int = args._module.run(args)
    except SystemExit as stop:  # a usage error, reported by the parser
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, data: object) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# -- the scheduler step ----------------------------------------------------------------------


def test_effective_requests_as_the_scheduler_computes_them() -> None:
    assert effective_requests(spec(pod("p", {"a": {FOO: 1}, "b": {FOO: 2, BAR: 1}}))) == {
        FOO: 3,
        BAR: 1,
    }
    # init containers run one at a time: the largest one counts if it exceeds the sum
    assert effective_requests(
        spec(pod("p", {"a": {FOO: 1}}, init={"i1": {FOO: 4}, "i2": {FOO: 2, BAR: 1}}))
    ) == {FOO: 4, BAR: 1}
    # sidecars (restartable init containers) add to the app containers, and to the init
    # containers started after them
    assert effective_requests(
        spec(pod("p", {"a": {FOO: 1}}, init={"side": {FOO: 1}, "i": {FOO: 2}}, sidecars=["side"]))
    ) == {FOO: 3}
    assert effective_requests(spec(pod("p", {"a": {}}))) == {}


def test_fit_score_and_the_scheduler_message() -> None:
    nodes = [
        NodeState("node-1", {FOO: 2}, {FOO: 1}),
        NodeState("node-2", {FOO: 2, BAR: 1}),
        NodeState("node-3", {FOO: 4}),
    ]
    decision = schedule({FOO: 1}, nodes)
    # least allocated: node-3 keeps 3/4 free, node-2 1/2, node-1 nothing
    assert decision.node == "node-3"
    assert decision.scores == {"node-1": 0, "node-2": 50, "node-3": 75}
    assert decision.unfit == {}
    # ties go to the first node
    assert schedule({FOO: 1}, [NodeState("a", {FOO: 2}), NodeState("b", {FOO: 2})]).node == "a"

    decision = schedule({FOO: 3, BAR: 1}, nodes)
    assert decision.node is None
    assert decision.unfit == {
        "node-1": ["Insufficient example.com/bar", "Insufficient example.com/foo"],
        "node-2": ["Insufficient example.com/foo"],
        "node-3": ["Insufficient example.com/bar"],
    }
    assert decision.message == (
        "0/3 nodes are available: 2 Insufficient example.com/bar, 2 Insufficient example.com/foo."
    )
    assert fit_error(3, {n: [f"Insufficient {FOO}"] for n in ("a", "b", "c")}) == (
        "0/3 nodes are available: 3 Insufficient example.com/foo."
    )


# -- placing pods on simulated nodes ---------------------------------------------------------


def test_pods_placed_across_nodes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path / "config.yaml", CONFIG)
    pods = write(
        tmp_path / "pods.yaml",
        pods_yaml(
            pod("one", {"c": {FOO: 1}}),  # all tie: node-1
            pod("two", {"c": {FOO: 1}}),  # node-1 is half full: node-2
            pod("pair", {"c": {FOO: 2}}),  # only node-3 fits; its two are on two NUMA nodes
            pod("three", {"c": {FOO: 3}}),  # no node has three
            pod("bars", {"c": {BAR: 2}}),
            pod("mixed", {"c": {FOO: 1, BAR: 1}}),  # node-3 (its foo is the least allocated)
            pod("bad", {"c": {FOO: 1}}, requests={"c": {FOO: 2}}),
            pod("one", {"c": {}}),
        ),
    )
    code, out, err = cluster_cli(
        capsys,
        "--nodes", "3", "--config", str(config), "-f", str(pods),
        "--topology-policy", "single-numa-node", "--output", "json",
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    placed = {r["pod"]: r for r in records if r["kind"] == "pod" and r["status"] != "Refused"}
    assert [r["pod"] for r in records if r["kind"] == "pod"] == [
        "one", "two", "pair", "three", "bars", "mixed", "bad", "one",
    ]  # fmt: skip

    one = placed["one"]
    assert (one["status"], one["node"]) == ("Admitted", "node-1")
    assert one["scores"] == {"node-1": 50, "node-2": 50, "node-3": 50}
    assert one["containers"][0]["devices"] == {FOO: ["null"]}
    assert one["containers"][0]["options"]["devices"] == [
        {"container_path": "/dev/null", "host_path": "/dev/null", "permissions": "rw"}
    ]

    two = placed["two"]
    assert (two["status"], two["node"]) == ("Admitted", "node-2")
    assert two["scores"] == {"node-1": 0, "node-2": 50, "node-3": 50}

    pair = placed["pair"]  # fits by count, refused by the node's topology manager
    assert (pair["status"], pair["node"]) == ("Rejected", "node-3")
    assert (pair["reason"], pair["message"]) == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    assert pair["unfit"] == {"node-1": [f"Insufficient {FOO}"], "node-2": [f"Insufficient {FOO}"]}
    assert pair["containers"] == []

    three = placed["three"]
    assert (three["status"], three["node"], three["reason"]) == (
        "Unschedulable",
        None,
        "Unschedulable",
    )
    assert three["message"] == f"0/3 nodes are available: 3 Insufficient {FOO}."
    assert placed["bars"]["message"] == f"0/3 nodes are available: 3 Insufficient {BAR}."

    mixed = placed["mixed"]
    assert (mixed["status"], mixed["node"]) == ("Admitted", "node-3")
    assert mixed["requests"] == {BAR: 1, FOO: 1}
    assert mixed["scores"] == {"node-1": 0, "node-2": 0, "node-3": 25}
    assert mixed["containers"][0]["devices"] == {BAR: ["bar-0"], FOO: ["null"]}

    refused = [r for r in records if r["kind"] == "pod" and r["status"] == "Refused"]
    assert [(r["pod"], r["reason"]) for r in refused] == [
        ("bad", "Invalid"),
        ("one", "AlreadyExists"),
    ]
    assert "must be equal to example.com/foo limit of 1" in refused[0]["message"]

    nodes = {r["node"]: r for r in records if r["kind"] == "node"}
    assert list(nodes) == ["node-1", "node-2", "node-3"]
    assert nodes["node-1"]["pods"] == ["default/one"]
    assert nodes["node-3"]["pods"] == ["default/mixed"]
    [foo3] = [r for r in nodes["node-3"]["resources"] if r["name"] == FOO]
    assert foo3 == {
        "name": FOO, "capacity": 2, "allocatable": 2, "allocated": 1, "requested": 1,
    }  # fmt: skip


def test_examples_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cluster_cli(
        capsys,
        "--nodes", "2",
        "--config", str(EXAMPLES / "cluster-config.yaml"),
        "-f", str(EXAMPLES / "cluster-pods.yaml"),
    )  # fmt: skip
    assert code == 0, err
    summary = out.split("\n\n")[0].splitlines()
    assert summary[0].split() == ["POD", "NODE", "STATUS", "REASON"]
    assert summary[1].split() == ["default/cuda-vector-add", "node-1", "Admitted"]
    assert summary[2].split() == ["default/train", "node-2", "Admitted"]
    assert summary[3].split() == ["default/flash", "node-1", "Admitted"]
    assert summary[4].split()[:3] == ["default/too-big", "-", "Unschedulable"]
    assert summary[4].endswith(f"0/2 nodes are available: 2 Insufficient {GPU}.")
    cuda = out.split("\n\n")[1]
    assert cuda.startswith(f"pod default/cuda-vector-add -> node-1 (requests {GPU}: 1)")
    assert "node-1: picked, score 50" in cuda
    assert "node-2: fits, score 50" in cuda
    assert "device      /dev/null -> /dev/nvidia0 (rw)" in cuda
    assert "env         NVIDIA_VISIBLE_DEVICES=0" in cuda
    assert f"node-1: Insufficient {GPU}" in out.split("\n\n")[2]
    assert re.search(r"^node-2\s+nvidia.com/gpu\s+2\s+2\s+2\s+2$", out, re.M)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0"], "--nodes: expected a number of nodes, 1 to 100, got '0'"),
        (["--numa-nodes", "0"], "--numa-nodes: expected a whole number, 1 or more"),
        (["--config", "{missing}"], "{missing}: cannot read the config: No such file"),
        (["--config", "{bad_config}"], "resources[0].virtual: expected an integer"),
        (["-f", "{missing}"], "-f/--filename: {missing}: no such file"),
        (["-f", "{not_yaml}"], "{not_yaml}:1:11: invalid YAML"),
        (["-f", "{service}"], "{service}: document 1: kind 'Service' is not supported, only Pod"),
        (["-f", "{empty}"], "{empty}: no pods in it"),
    ],
)
def test_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    files = {
        "config": write(tmp_path / "config.yaml", CONFIG),
        "pods": write(tmp_path / "pods.yaml", pods_yaml(pod("p", {"c": {FOO: 1}}))),
        "missing": tmp_path / "missing.yaml",
        "bad_config": write(tmp_path / "bad.yaml", {"resources": [{"name": FOO, "virtual": 0}]}),
        "not_yaml": write(tmp_path / "not.yaml", "kind: [Pod"),
        "service": write(tmp_path / "service.yaml", "kind: Service\n"),
        "empty": write(tmp_path / "empty.yaml", "# nothing\n"),
    }
    names = {k: str(v) for k, v in files.items()}
    options = {"--config": str(files["config"]), "-f": str(files["pods"])}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        options[flag] = value.format(**names)
    code, out, err = cluster_cli(capsys, *[x for item in options.items() for x in item])
    assert code == 2
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("devplug cluster: ")
    assert message.format(**names) in line


def make_gpu_nodes(folder: Path, count: int) -> list[Path]:
    """Device nodes named like the NVIDIA driver's (character devices when allowed)."""
    folder.mkdir()
    paths = []
    for index in range(count):
        path = folder / f"nvidia{index}"
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            path.touch()
        paths.append(path)
    return paths


def test_gpu_pod_gets_dev_nvidia0(tmp_path: Path) -> None:
    """The seed scenario, through the `devplug cluster` command as a process: a pod
    asking for nvidia.com/gpu: 1 ends with a container that gets /dev/nvidia0."""
    gpus = make_gpu_nodes(tmp_path / "dev", 2)
    config = write(
        tmp_path / "gpus.yaml",
        {
            "resources": [
                {
                    "name": GPU,
                    "allowAnyPath": True,
                    "groups": [
                        {
                            "paths": [{"path": str(path), "containerPath": f"/dev/nvidia{i}"}],
                            "env": {"NVIDIA_VISIBLE_DEVICES": str(i)},
                        }
                        for i, path in enumerate(gpus)
                    ],
                }
            ]
        },
    )
    pods = write(tmp_path / "pods.yaml", pods_yaml(pod("cuda", {"cuda": {GPU: 1}})))
    result = subprocess.run(
        cli_command(
            "cluster", "--nodes", "2", "--config", str(config), "-f", str(pods), "-o", "json"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    [cuda, *nodes] = [json.loads(line) for line in result.stdout.splitlines()]
    assert (cuda["pod"], cuda["status"], cuda["node"]) == ("cuda", "Admitted", "node-1")
    [container] = cuda["containers"]
    assert container["state"] == "Started"
    assert container["options"]["devices"] == [
        {"container_path": "/dev/nvidia0", "host_path": str(gpus[0]), "permissions": "rw"}
    ]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"} in container["options"]["envs"]
    assert [n["node"] for n in nodes] == ["node-1", "node-2"]


def test_ctrl_c_removes_every_process_and_folder(tmp_path: Path) -> None:
    config = write(tmp_path / "config.yaml", CONFIG)
    pods = write(tmp_path / "pods.yaml", pods_yaml(pod("p", {"c": {FOO: 1}})))
    proc = subprocess.Popen(
        cli_command("cluster", "--nodes", "3", "--config", str(config), "-f", str(pods)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    started = []
    while len(started) < 3:  # each node logs its folder and plugin pid as it starts
        line = proc.stderr.readline()
        assert line, proc.communicate()
        match = re.search(r"(node-\d): kubelet simulator in (\S+), devplug serve pid (\d+)", line)
        if match:
            started.append((Path(match.group(2)), int(match.group(3))))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    # Interrupted (130), or done already (0) when the signal came after the last pod.
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err
    if proc.returncode == 130:
        assert "devplug cluster: interrupted" in err
    for folder, pid in started:
        assert not folder.exists()
        assert not folder.parent.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_node_that_does_not_come_up_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A valid config whose socket path is too long for the nodes' plugin folders:
    # `devplug serve` refuses it before serving (exit 2), and the node never comes up.
    name = "a" * 60 + ".example.com/" + "b" * 60
    config = write(tmp_path / "long.yaml", {"resources": [{"name": name, "virtual": 1}]})
    pods = write(tmp_path / "pods.yaml", pods_yaml(pod("p", {"c": {}})))
    code, out, err = cluster_cli(capsys, "--nodes", "2", "--config", str(config), "-f", str(pods))
    assert code == 1
    assert out == ""
    assert re.search(r"devplug cluster: node-\d: devplug serve exited with status 2", err)
