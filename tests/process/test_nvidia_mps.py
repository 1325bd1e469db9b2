"""MPS sharing as NVIDIA's plugin does it: `devplug serve` starts and supervises one
control daemon per shared resource (the stand-in `devplug.fakes.mps`, which speaks
the documented control interface) at NVIDIA's paths, tells it each GPU's share, and
each replica's container gets what NVIDIA's plugin gives it (cmd/mps-control-daemon,
internal/plugin/mps.go)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.mps import PID_FILE, STATE, script
from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid
from devplug.outputs.nfd import parse_features
from devplug.sources import ConfigError, parse_config
from devplug.testing import KubeletHarness

GPU = "nvidia.com/gpu"
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 5}
EXCLUSIVE_PROCESS, PROHIBITED, DEFAULT = 3, 2, 0  # NVML_COMPUTEMODE_*


@pytest.fixture
def mps_root(short_tmp: Path) -> Iterator[Path]:
    root = short_tmp / "mps"
    yield root
    # A daemon a failed test left behind is stopped here, not left running.
    for pid_file in root.glob(f"**/pipe/{PID_FILE}"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def h100s(folder: Path, count: int) -> FakeGpuHost:
    description = eight_gpus()
    description["gpus"] = description["gpus"][:count]
    return FakeGpuHost(folder / "gpus", description)


def mps_config(host: FakeGpuHost, root: Path, bin_dir: Path, **nvidia: Any) -> str:
    entry = {
        "hostRoot": host.host_root,
        **FAST,
        "sharing": "mps",
        "replicas": 4,
        "mps": {"root": str(root), "control": str(script(bin_dir)), "checkSeconds": 0.1},
        **nvidia,
    }
    return yaml.safe_dump({"resources": [{"nvidia": entry}]})


def state(root: Path) -> dict[str, Any] | None:
    path = root / "nvidia.com" / "gpu" / "log" / STATE
    return json.loads(path.read_text()) if path.exists() else None


def daemon_pid(root: Path) -> int | None:
    path = root / "nvidia.com" / "gpu" / "pipe" / PID_FILE
    return int(path.read_text()) if path.exists() else None


def limits_set(root: Path, memory: dict[str, str], percentage: str) -> bool:
    s = state(root)
    return (
        s is not None
        and s["pinnedMemLimits"] == memory
        and s["activeThreadPercentage"] == percentage
    )


def test_stand_in_speaks_the_control_interface(short_tmp: Path) -> None:
    control = str(script(short_tmp / "bin"))
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(short_tmp / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(short_tmp / "log"),
    }

    def ask(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [control], input=text, env=env, capture_output=True, text=True, timeout=30
        )

    alone = ask("get_default_active_thread_percentage\n")
    assert alone.returncode == 1
    assert "Cannot find MPS control daemon process" in alone.stderr
    started = subprocess.run([control, "-d"], env=env, timeout=30)
    assert started.returncode == 0
    pid = int((short_tmp / "pipe" / PID_FILE).read_text())
    try:
        again = subprocess.run([control, "-d"], env=env, capture_output=True, text=True)
        assert again.returncode == 1  # one daemon per pipe folder
        assert ask("set_default_active_thread_percentage 25\n").returncode == 0
        assert ask("get_default_active_thread_percentage\n").stdout == "25.0\n"
        assert ask("bogus\n").stdout == "Invalid command: bogus\n"
        assert ask("quit\n").returncode == 0
        log = (short_tmp / "log" / "control.log").read_text()
        assert "Cmd:set_default_active_thread_percentage 25" in log
        assert not (short_tmp / "pipe" / PID_FILE).exists()
        assert ask("get_server_list\n").returncode == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_one_supervised_daemon_per_resource_at_nvidias_paths(
    kubelet: KubeletHarness, short_tmp: Path, mps_root: Path
) -> None:
    host = h100s(short_tmp, 2)
    host.set(1, computeMode=PROHIBITED)  # given back as it was
    features = short_tmp / "features"
    text = yaml.safe_load(mps_config(host, mps_root, short_tmp / "bin"))
    text["nodeFeatures"] = {"path": str(features)}
    uuids = [gpu_uuid(0), gpu_uuid(1)]
    # A daemon an earlier run left running in the resource's folder is kept, not doubled.
    left = mps_root / "nvidia.com" / "gpu"
    daemon_env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(left / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(left / "log"),
    }
    subprocess.run([str(script(short_tmp / "bin")), "-d"], env=daemon_env, check=True)
    earlier = daemon_pid(mps_root)
    process = kubelet.start_serve(yaml.safe_dump(text), env=host.env)
    kubelet.wait_for_resource(GPU, count=8)  # healthy at once: the daemon runs first
    # 81559 MiB and 100 % of the SMs in 4: the daemon is told one replica's share of each.
    share = {"0": "20389M", "1": "20389M"}
    kubelet.wait_until(lambda: limits_set(mps_root, share, "25.0"), what="the daemon's limits")
    assert daemon_pid(mps_root) == earlier
    assert "MPS control daemon of nvidia.com/gpu kept from before" in process.output
    assert "Unhealthy" not in process.output
    host.reload()
    assert [host.gpu(i)["computeMode"] for i in (0, 1)] == [EXCLUSIVE_PROCESS] * 2

    pod = kubelet.admit({GPU: 1})
    [replica] = pod.devices()[GPU]
    uuid = replica.partition("::")[0]
    env = pod.env()
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",  # NVIDIA's container path
        "NVIDIA_VISIBLE_DEVICES": uuid,
    }
    assert pod.mounts() == {
        "/mps/nvidia.com/gpu/pipe": str(left / "pipe"),
        "/dev/shm": str(mps_root / "shm"),
    }
    two = kubelet.admit({GPU: 2})
    assert not two.admitted
    assert "one MPS replica" in two.message

    kubelet.wait_until(features.exists, what="the feature file")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"

    # A daemon that dies: the resource's replicas go Unhealthy, it is started again and
    # told the limits again, and they come back.
    first = daemon_pid(mps_root)
    assert first is not None
    seq = kubelet.last_event_seq
    os.kill(first, signal.SIGKILL)
    kubelet.wait_until(
        lambda: any(
            e.seq > seq and e.kind == "devices" and e.detail == "0/8 healthy"
            for e in kubelet.events()
        ),
        what="the replicas Unhealthy",
    )
    kubelet.wait_until(
        lambda: (
            len(kubelet.device_ids(GPU, healthy=True)) == 8
            and daemon_pid(mps_root) not in (None, first)
            and limits_set(mps_root, share, "25.0")
        ),
        what="the daemon started again",
    )
    assert "MPS control daemon of nvidia.com/gpu does not answer" in process.output
    s = state(mps_root)
    assert s is not None
    assert s["visibleDevices"] == ",".join(uuids)  # started here: the resource's GPUs

    # Stopping devplug stops its daemon and gives the GPUs back the modes they had.
    assert process.stop() == 0
    assert daemon_pid(mps_root) is None
    s = state(mps_root)
    assert s is not None
    assert s["commands"][-1] == "quit"
    host.reload()
    assert [host.gpu(i)["computeMode"] for i in (0, 1)] == [DEFAULT, PROHIBITED]


def test_fail_requests_greater_than_one_false_gives_two_replicas_as_nvidia(
    kubelet: KubeletHarness, short_tmp: Path, mps_root: Path
) -> None:
    host = h100s(short_tmp, 2)
    text = mps_config(host, mps_root, short_tmp / "bin", failRequestsGreaterThanOne=False)
    kubelet.start_serve(text, env=host.env)
    kubelet.wait_for_resource(GPU, count=8)
    pod = kubelet.admit({GPU: 2})
    assert pod.admitted, pod.message
    assert pod.env()["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"


def test_no_control_program_leaves_the_replicas_unhealthy(
    kubelet: KubeletHarness, short_tmp: Path, mps_root: Path
) -> None:
    host = h100s(short_tmp, 1)
    text = yaml.safe_load(mps_config(host, mps_root, short_tmp / "bin"))
    text["resources"][0]["nvidia"]["mps"]["control"] = str(short_tmp / "missing")
    process = kubelet.start_serve(yaml.safe_dump(text), env=host.env)
    kubelet.wait_for_resource(GPU, count=0, capacity=4)
    kubelet.wait_until(lambda: "cannot start" in process.output, what="the daemon's start failing")
    assert f"{short_tmp / 'missing'}: No such file or directory" in process.output
    assert process.running


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"replicas": 1}, "replicas: MPS sharing needs at least 2 replicas per GPU"),
        ({"migStrategy": "mixed"}, "migStrategy: migStrategy mixed is not supported with MPS"),
        ({"mps": {"root": "run/mps"}}, "mps.root: expected an absolute path, got 'run/mps'"),
        ({"mps": {"checkSeconds": 0}}, "mps.checkSeconds: expected a number > 0, got 0"),
        ({"sharing": "mig"}, "sharing: "),
    ],
)
def test_bad_mps_settings_are_one_line(change: dict[str, Any], problem: str) -> None:
    entry: dict[str, Any] = {"sharing": "mps", "replicas": 2} | change
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump({"resources": [{"nvidia": entry}]}), "c.yaml")
    assert str(caught.value).startswith(f"c.yaml: resources[0].nvidia.{problem}")
    assert "\n" not in str(caught.value)
