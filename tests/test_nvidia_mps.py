"""MPS sharing: `devplug serve` starts and supervises one control daemon per shared GPU
(the stand-in `devplug.testing.fakemps`, which speaks the documented control interface),
and each replica's container gets that daemon's folders and its share of the GPU."""

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

from devplug.outputs.nfd import parse_features
from devplug.sources import ConfigError, parse_config
from devplug.testing import KubeletHarness
from devplug.testing.fakemps import PID_FILE, STATE, script
from devplug.testing.fakenvml import FakeGpuHost, eight_gpus, gpu_uuid

GPU = "nvidia.com/gpu"
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 5}
EXCLUSIVE_PROCESS, PROHIBITED, DEFAULT = 3, 2, 0  # NVML_COMPUTEMODE_*


@pytest.fixture
def mps_root(short_tmp: Path) -> Iterator[Path]:
    root = short_tmp / "mps"
    yield root
    # A daemon a failed test left behind is stopped here, not left running.
    for pid_file in root.glob(f"*/*/pipe/{PID_FILE}"):
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


def state(root: Path, uuid: str) -> dict[str, Any] | None:
    path = root / "nvidia.com_gpu" / uuid / "log" / STATE
    return json.loads(path.read_text()) if path.exists() else None


def daemon_pid(root: Path, uuid: str) -> int | None:
    path = root / "nvidia.com_gpu" / uuid / "pipe" / PID_FILE
    return int(path.read_text()) if path.exists() else None


def limits_set(root: Path, uuid: str, memory: str, percentage: str) -> bool:
    s = state(root, uuid)
    return (
        s is not None
        and s["pinnedMemLimits"] == {"0": memory}
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


def test_one_supervised_daemon_per_gpu_and_each_replica_gets_its_share(
    kubelet: KubeletHarness, short_tmp: Path, mps_root: Path
) -> None:
    host = h100s(short_tmp, 2)
    host.set(1, computeMode=PROHIBITED)  # given back as it was
    features = short_tmp / "features"
    text = yaml.safe_load(mps_config(host, mps_root, short_tmp / "bin"))
    text["nodeFeatures"] = {"path": str(features)}
    uuids = [gpu_uuid(0), gpu_uuid(1)]
    # A daemon an earlier devplug left running in GPU 0's folder is kept, not doubled.
    left = mps_root / "nvidia.com_gpu" / uuids[0]
    daemon_env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(left / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(left / "log"),
    }
    subprocess.run([str(script(short_tmp / "bin")), "-d"], env=daemon_env, check=True)
    earlier = daemon_pid(mps_root, uuids[0])
    process = kubelet.start_serve(yaml.safe_dump(text), env=host.env)
    kubelet.wait_for_resource(GPU, count=8)  # healthy at once: the daemons run first
    # 81559 MiB and 100 % of the SMs in 4: each daemon is told one replica's share.
    for uuid in uuids:
        kubelet.wait_until(
            lambda u=uuid: limits_set(mps_root, u, "20389M", "25.0"),  # type: ignore[misc]
            what=f"the limits of {uuid}'s daemon",
        )
    s = state(mps_root, uuids[1])
    assert s is not None
    assert s["visibleDevices"] == uuids[1]  # its own GPU only
    assert daemon_pid(mps_root, uuids[0]) == earlier
    assert f"MPS control daemon of {uuids[0]} kept from before" in process.output
    assert "Unhealthy" not in process.output
    host.reload()
    assert [host.gpu(i)["computeMode"] for i in (0, 1)] == [EXCLUSIVE_PROCESS] * 2

    pod = kubelet.admit({GPU: 1})
    [replica] = pod.devices()[GPU]
    uuid = replica.partition("::")[0]
    base = mps_root / "nvidia.com_gpu" / uuid
    env = pod.env()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(base / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(base / "log")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert pod.mounts() == {
        str(base / "pipe"): str(base / "pipe"),
        str(base / "log"): str(base / "log"),
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

    # A daemon that dies: its GPU's replicas go Unhealthy, it is started again and told
    # the limits again, and they come back.
    first = daemon_pid(mps_root, uuids[1])
    assert first is not None
    seq = kubelet.last_event_seq
    os.kill(first, signal.SIGKILL)
    kubelet.wait_until(
        lambda: any(
            e.seq > seq and e.kind == "devices" and e.detail == "4/8 healthy"
            for e in kubelet.events()
        ),
        what="GPU 1's replicas Unhealthy",
    )
    kubelet.wait_until(
        lambda: (
            len(kubelet.device_ids(GPU, healthy=True)) == 8
            and daemon_pid(mps_root, uuids[1]) not in (None, first)
            and limits_set(mps_root, uuids[1], "20389M", "25.0")
        ),
        what="GPU 1's daemon started again",
    )
    assert "MPS control daemon of " + uuids[1] + " does not answer" in process.output

    # Stopping devplug stops its daemons and gives the GPUs back the modes they had.
    assert process.stop() == 0
    for uuid in uuids:
        assert daemon_pid(mps_root, uuid) is None
        s = state(mps_root, uuid)
        assert s is not None
        assert s["commands"][-1] == "quit"
    host.reload()
    assert [host.gpu(i)["computeMode"] for i in (0, 1)] == [DEFAULT, PROHIBITED]


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
        ({"migStrategy": "single"}, "sharing: MPS sharing is not supported with MIG"),
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
