"""NVIDIA GPUs served by the real `devplug serve` against the kubelet simulator, with the
fake NVML driver (devplug.fakes.nvml) standing in for a GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.nvml import (
    FakeGpuHost,
    eight_gpus,
    fake_host,
    gpu,
    gpu_uuid,
    mig_layout,
    mig_uuid,
)
from devplug.outputs.nfd import parse_features
from devplug.testing import KubeletHarness, PodAdmission, pod_manifest

GPU = "nvidia.com/gpu"
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 2}


def config(host: FakeGpuHost, features: Path | None = None, **nvidia: Any) -> str:
    entry = {"nvidia": {"hostRoot": host.host_root, **FAST, **nvidia}}
    document: dict[str, Any] = {"resources": [entry]}
    if features is not None:
        document["nodeFeatures"] = {"path": str(features)}
    return yaml.safe_dump(document)


def serve(kubelet: KubeletHarness, host: FakeGpuHost, text: str, count: int) -> None:
    kubelet.start_serve(text, env=host.env)
    kubelet.wait_for_resource(GPU, count=count)


@pytest.fixture
def eight(short_tmp: Path) -> FakeGpuHost:
    return FakeGpuHost(short_tmp / "gpus", eight_gpus() | {"machine": "DGX H100"})


def test_discovery_allocation_topology_and_labels(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    features = short_tmp / "features.d" / "devplug"
    serve(kubelet, eight, config(eight, features), 8)
    devices = {d.id: d for d in kubelet.devices(GPU)}
    assert sorted(devices) == sorted(gpu_uuid(i) for i in range(8))
    assert [devices[gpu_uuid(i)].numa_nodes for i in (0, 3, 4, 7)] == [[0], [0], [1], [1]]

    one = kubelet.admit({GPU: 1})
    [uuid] = one.devices()[GPU]
    index = int(uuid.split("-")[1], 16)
    assert one.env()["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert set(one.device_nodes()) == {
        f"/dev/nvidia{index}",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }  # /dev/nvidia-modeset does not exist on this host: not passed
    kubelet.delete(one)

    # A 2-GPU pod gets an NVLink pair, not the two GPUs under one PCIe switch; the
    # next gets the next pair.
    first = kubelet.admit({GPU: 2})
    assert sorted(first.devices()[GPU]) == [gpu_uuid(0), gpu_uuid(3)]
    assert sorted(first.env()["NVIDIA_VISIBLE_DEVICES"].split(",")) == [gpu_uuid(0), gpu_uuid(3)]
    second = kubelet.admit({GPU: 2})
    assert sorted(second.devices()[GPU]) == [gpu_uuid(1), gpu_uuid(2)]

    kubelet.wait_until(lambda: features.exists(), what="the feature file")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"  # what NVML reports for an H100 80GB
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == (
        "9",
        "0",
    )
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/mig.capable"] == "true"  # an H100 is, MIG off
    assert "nvidia.com/mig.strategy" not in labels  # GFD labels none only by leaving it out
    assert labels["nvidia.com/mps.capable"] == "false"
    assert labels["nvidia.com/gpu.mode"] == "compute"  # PCI class 0x030200
    assert labels["nvidia.com/gpu.machine"] == "DGX-H100"
    assert labels["nvidia.com/cuda.driver-version.full"] == "550.54.15"
    assert labels["nvidia.com/cuda.driver.major"] == "550"  # GFD's deprecated name too
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.4"


def test_xid_policy_transient_recovers_reset_waits_for_a_reset(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    daemon = kubelet.start_serve(config(eight, recoverySeconds=1, ignoredXids=[48]), env=eight.env)
    kubelet.wait_for_resource(GPU, count=8)
    eight.inject_xid(2, 13)  # application error: ignored by default
    eight.inject_xid(4, 48)  # double-bit ECC error: needs a reset, but ignored as configured
    eight.inject_xid(5, 95)  # uncontained memory error: the catalog says RESET_GPU
    eight.inject_xid(3, 94)  # contained memory error: RESTART_APP, transient
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(3), gpu_uuid(5)],
        what="GPUs 3 and 5 unhealthy",
    )
    # Events are handled in order: the ignored Xids came first and changed nothing.
    assert {gpu_uuid(2), gpu_uuid(4)} <= set(kubelet.device_ids(GPU, healthy=True))
    # GPU 3 recovers after the quiet time; GPU 5 does not: it waits for a reset.
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(5)], what="GPU 3 healthy"
    )
    eight.set_lost(5, True)  # a reset takes the GPU off the bus and back
    kubelet.wait_until(lambda: "GPU 5 does not answer" in daemon.output, what="GPU 5 lost")
    eight.set_lost(5, False)
    kubelet.wait_for_resource(GPU, count=8)
    assert kubelet.admit({GPU: 8}).admitted


def test_lost_gpu_is_unhealthy_until_it_answers(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    serve(kubelet, eight, config(eight, recoverySeconds=30), 8)
    eight.set_lost(5, True)
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(5)], what="GPU 5 unhealthy"
    )
    eight.set_lost(5, False)  # no critical Xid: healthy as soon as it answers
    kubelet.wait_for_resource(GPU, count=8)


def test_gpu_lost_at_start_joins_when_it_answers(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    eight.set_lost(6, True)
    serve(kubelet, eight, config(eight), 7)
    assert gpu_uuid(6) not in kubelet.device_ids(GPU)
    eight.set_lost(6, False)
    kubelet.wait_for_resource(GPU, count=8)


def test_no_gpu_at_start_registers_zero_devices_and_looks_again(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    gpus = eight.description["gpus"]
    eight.update(lambda d: d.__setitem__("gpus", []))
    process = kubelet.start_serve(config(eight), env=eight.env)
    kubelet.wait_for_resource(GPU, count=0, capacity=0)
    assert "NVML sees no GPU" in process.output
    eight.update(lambda d: d.__setitem__("gpus", gpus))  # the driver has come up
    kubelet.wait_for_resource(GPU, count=8)


def test_no_driver_registers_zero_devices_and_retries(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    eight.set_driver(loaded=False)
    text = config(eight).replace(
        "resources:\n", "resources:\n- name: example.com/other\n  virtual: 2\n"
    )
    process = kubelet.start_serve(text, env=eight.env)
    kubelet.wait_for_resource(GPU, count=0, capacity=0)
    kubelet.wait_for_resource("example.com/other", count=2)
    assert kubelet.admit({"example.com/other": 1}).admitted
    eight.set_driver(loaded=True)
    kubelet.wait_for_resource(GPU, count=8)
    assert process.output.count("NVML is not usable") == 1


def test_nvml_that_hangs_at_start_does_not_stop_serving(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    eight.set_driver(hang=True)
    kubelet.start_serve(config(eight, nvmlTimeoutSeconds=0.3), env=eight.env)
    kubelet.wait_for_resource(GPU, count=0, capacity=0)
    eight.set_driver(hang=False)
    kubelet.wait_for_resource(GPU, count=8)
    # NVML stops answering while serving: every GPU Unhealthy, and back when it answers.
    eight.set_driver(hang=True)
    kubelet.wait_for_resource(GPU, count=0, capacity=8)
    eight.set_driver(hang=False)
    kubelet.wait_for_resource(GPU, count=8)


def test_without_the_driver_library(kubelet: KubeletHarness, short_tmp: Path) -> None:
    """The real pynvml on this host, which has no NVIDIA driver: zero GPUs, one line."""
    env = {"DEVPLUG_NVML_MODULE": ""}
    process = kubelet.start_serve("resources:\n- nvidia: {}\n", env=env)
    kubelet.wait_for_resource(GPU, count=0, capacity=0)
    assert "NVML is not usable" in process.output


def gpus_of(pod: PodAdmission, resource: str) -> list[str]:
    return sorted({i.partition("::")[0] for i in pod.devices()[resource]})


def test_time_slicing_spread_pack_and_one_replica_per_container(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    features = short_tmp / "features"
    serve(kubelet, eight, config(eight, features, replicas=4), 32)
    spread = kubelet.admit({GPU: 2})
    assert gpus_of(spread, GPU) == [gpu_uuid(0), gpu_uuid(3)]  # two GPUs, an NVLink pair
    kubelet.delete(spread)
    kubelet.wait_until(features.exists, what="the feature file")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.count"] == "8"  # GPUs, not replicas

    kubelet.start_serve(
        config(eight, replicas=4, replicaPolicy="pack").replace(
            "- nvidia:", "- name: example.com/packed\n  nvidia:"
        ),
        env=eight.env,
    )
    kubelet.wait_for_resource("example.com/packed", count=32)
    packed = kubelet.admit({"example.com/packed": 2})
    assert gpus_of(packed, "example.com/packed") == [gpu_uuid(0)]
    # Six replicas need two GPUs: GPU 0's last two and all of its NVLink peer's (GPU 3),
    # rather than the next GPU by index, which shares a PCIe switch but no NVLink.
    spanning = kubelet.admit({"example.com/packed": 6})
    assert gpus_of(spanning, "example.com/packed") == [gpu_uuid(0), gpu_uuid(3)]

    kubelet.start_serve(
        config(eight, replicas=4, failRequestsGreaterThanOne=True).replace(
            "- nvidia:", "- name: example.com/strict\n  nvidia:"
        ),
        env=eight.env,
    )
    kubelet.wait_for_resource("example.com/strict", count=32)
    refused = kubelet.admit({"example.com/strict": 2})
    assert not refused.admitted
    assert "failRequestsGreaterThanOne" in refused.message
    assert kubelet.admit({"example.com/strict": 1}).admitted


def test_volume_mounts_and_cdi(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    text = config(
        eight,
        deviceListStrategy=["volume-mounts", "cdi-cri"],
        passDeviceSpecs=False,
        cdiDir=str(short_tmp / "cdi"),
    )
    serve(kubelet, eight, text, 8)
    pod = kubelet.admit({GPU: 1})
    [uuid] = pod.devices()[GPU]
    assert pod.env()["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert pod.mounts() == {f"/var/run/nvidia-container-devices/{uuid}": "/dev/null"}
    assert pod.cdi_devices() == [f"k8s.device-plugin.nvidia.com/gpu={uuid}"]
    assert pod.device_nodes() == {}


def test_mig_mixed_serves_one_resource_per_profile(
    kubelet: KubeletHarness, short_tmp: Path
) -> None:
    host = FakeGpuHost(short_tmp / "mig", mig_layout())
    kubelet.start_serve(config(host, migStrategy="mixed"), env=host.env)
    kubelet.wait_for_resource(GPU, count=1)  # GPU 2, MIG off
    kubelet.wait_for_resource("nvidia.com/mig-1g.5gb", count=7)
    kubelet.wait_for_resource("nvidia.com/mig-2g.10gb", count=2)
    kubelet.wait_for_resource("nvidia.com/mig-3g.20gb", count=1)
    pod = kubelet.admit({"nvidia.com/mig-3g.20gb": 1})
    # GPU 1's 3g.20gb took the upper half (GPU instance 2), its 2g.10gb 2:2 and 0:2.
    assert pod.devices()["nvidia.com/mig-3g.20gb"] == [mig_uuid(1, 2)]
    assert pod.env()["NVIDIA_VISIBLE_DEVICES"] == mig_uuid(1, 2)
    minors = (Path(host.host_root) / "proc/driver/nvidia-caps/mig-minors").read_text().split()
    gi = minors[minors.index("gpu1/gi2/access") + 1]
    ci = minors[minors.index("gpu1/gi2/ci0/access") + 1]
    assert set(pod.device_nodes()) >= {
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{gi}",
        f"/dev/nvidia-caps/nvidia-cap{ci}",
        "/dev/nvidiactl",
    }
    # An Xid on one GPU instance turns only that MIG device Unhealthy.
    host.inject_xid(1, 94, gi=4)
    kubelet.wait_for_resource("nvidia.com/mig-2g.10gb", count=1)
    assert kubelet.device_ids("nvidia.com/mig-2g.10gb", healthy=False) == [mig_uuid(1, 4)]
    assert kubelet.device_ids("nvidia.com/mig-3g.20gb", healthy=True) == [mig_uuid(1, 2)]


def test_mig_names_on_an_h200_are_nvidias(kubelet: KubeletHarness, short_tmp: Path) -> None:
    """1g.18gb on an H200 (its 16 GiB alone would say 1g.16gb), and the +me profile a
    resource of its own, not folded into the plain one."""
    host = FakeGpuHost(
        short_tmp / "h200",
        fake_host("gpus: [{model: H200-SXM5-141GB, mig: [3g.71gb, 1g.18gb+me, 1g.18gb]}]"),
    )
    features = short_tmp / "features"
    kubelet.start_serve(config(host, features, migStrategy="mixed"), env=host.env, wait=False)
    kubelet.wait_for_resource("nvidia.com/mig-1g.18gb", count=1)
    kubelet.wait_for_resource("nvidia.com/mig-1g.18gb.me", count=1)
    kubelet.wait_for_resource("nvidia.com/mig-3g.71gb", count=1)
    kubelet.wait_until(features.exists, what="the feature file")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/mig-1g.18gb.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert labels["nvidia.com/mig-1g.18gb.memory"] == "16384"


def test_xid_on_a_mig_instance_of_a_gpu_served_whole(
    kubelet: KubeletHarness, short_tmp: Path
) -> None:
    host = FakeGpuHost(short_tmp / "mig", mig_layout())
    serve(kubelet, host, config(host), 3)  # migStrategy none: GPUs 0 and 1 whole
    host.inject_xid(1, 94, gi=2)
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(1)], what="GPU 1 unhealthy"
    )


def test_mig_single_and_per_model_names(kubelet: KubeletHarness, short_tmp: Path) -> None:
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_gib": 40, "cc": (8, 0)}
    single = FakeGpuHost(
        short_tmp / "single",
        {"gpus": [gpu(i, model_key="A100-SXM4-40GB", mig=["1g.5gb"] * 7) for i in range(2)]},
    )
    features = short_tmp / "features"
    kubelet.start_serve(config(single, features, migStrategy="single"), env=single.env)
    kubelet.wait_for_resource(GPU, count=14)
    assert kubelet.admit({GPU: 1}).env()["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    kubelet.wait_until(features.exists, what="the feature file")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("14", "4864")
    assert (labels["nvidia.com/mig.strategy"], labels["nvidia.com/mig.capable"]) == (
        "single",
        "true",
    )

    mixed_models = FakeGpuHost(
        short_tmp / "models",
        {"gpus": [gpu(0), gpu(1, **a100), gpu(2, name="NVIDIA L4", memory_gib=24)]},  # type: ignore[arg-type]
    )
    text = config(
        mixed_models, perModelNames=True, resourceNames={"NVIDIA L4": "example.com/l4"}
    ).replace("- nvidia:", "- name: example.com/gpu\n  nvidia:")
    kubelet.start_serve(text, env=mixed_models.env, wait=False)
    kubelet.wait_for_resource("example.com/gpu", count=0)
    kubelet.wait_for_resource("example.com/gpu-h100-80gb-hbm3", count=1)
    kubelet.wait_for_resource("example.com/gpu-a100-sxm4-40gb", count=1)
    kubelet.wait_for_resource("example.com/l4", count=1)
    pod = kubelet.admit({"example.com/gpu-a100-sxm4-40gb": 1})
    assert pod.devices()["example.com/gpu-a100-sxm4-40gb"] == [gpu_uuid(1)]


def devplug(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )


def test_gpus_command(short_tmp: Path) -> None:
    host = FakeGpuHost(short_tmp / "mig", mig_layout())
    path = short_tmp / "gpus.yaml"
    path.write_text(config(host, migStrategy="mixed"))
    text = devplug("gpus", "--config", str(path), env=host.env)
    assert text.returncode == 0, text.stderr
    assert "driver 550.54.15, CUDA 12.4, 3 GPU(s)" in text.stdout
    assert mig_uuid(0, 13) in text.stdout  # the 1g.5gb at memory slice 6
    assert "serves nvidia.com/mig-1g.5gb: 7 device(s)" in text.stdout
    assert "nvidia.com/mig.strategy=mixed" in text.stdout
    assert "nvidia.com/mig-2g.10gb.product=NVIDIA-A100-SXM4-40GB-MIG-2g.10gb" in text.stdout
    assert "nvidia.com/mig-2g.10gb.count=2" in text.stdout

    result = devplug("gpus", "--host-root", host.host_root, "--output", "json", env=host.env)
    [report] = json.loads(result.stdout)["sources"]
    assert [g["numaNode"] for g in report["nvml"]["gpus"]] == [0, 0, 0]
    assert [g["mig"] for g in report["nvml"]["gpus"]] == ["on", "on", "capable"]
    assert report["labels"]["nvidia.com/mig.capable"] == "true"

    missing = devplug("gpus", env={"DEVPLUG_NVML_MODULE": ""})
    assert missing.returncode == 1
    assert "NVML is not usable" in missing.stdout


def test_check_lists_gpus(short_tmp: Path) -> None:
    host = FakeGpuHost(short_tmp / "gpus", eight_gpus())
    path = short_tmp / "gpus.yaml"
    path.write_text(config(host))
    result = devplug("check", "--config", str(path), "--output", "json", env=host.env)
    [resource] = json.loads(result.stdout)["resources"]
    assert (resource["name"], resource["kind"], resource["count"]) == (GPU, "nvidia", 1)
    assert [d["id"] for d in resource["devices"]] == [gpu_uuid(i) for i in range(8)]
    # Time-sliced: the count is the replicas served of each GPU.
    path.write_text(config(host, replicas=4))
    text = devplug("check", "--config", str(path), env=host.env)
    assert f"{GPU} (nvidia, count 4, env -): 32 device(s), 32 healthy" in text.stdout


def test_nvml_binding_loads_with_a_gpu_resource(kubelet: KubeletHarness, short_tmp: Path) -> None:
    """The counterpart of test_daemon_process's lean check: with an `nvidia:` resource the
    binding is imported (here a `pynvml` that records its import and fails it)."""
    poison = short_tmp / "poison"
    poison.mkdir()
    marker = short_tmp / "imported"
    (poison / "pynvml.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('poisoned')\n"
    )
    path = os.pathsep.join(filter(None, [str(poison), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "DEVPLUG_NVML_MODULE": ""}
    gpus = kubelet.start_serve("resources:\n- nvidia: {}\n", env=env)
    kubelet.wait_for_resource(GPU, count=0)
    assert marker.exists()
    assert "poisoned" in gpus.output
    assert not kubelet.admit(pod_manifest("p", {"main": {GPU: 1}})).admitted


def test_event_wait_failure_marks_every_gpu_until_watched_again(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    """The event wait failing (here: the driver's, persistently) leaves no Xid visible:
    every GPU is Unhealthy, as NVIDIA's plugin marks them, until a new event set works."""
    daemon = kubelet.start_serve(config(eight), env=eight.env)
    kubelet.wait_for_resource(GPU, count=8)
    eight.set_driver(waitError="Unknown")
    kubelet.wait_for_resource(GPU, count=0, capacity=8)
    eight.set_driver(waitError="")
    kubelet.wait_for_resource(GPU, count=8)
    assert daemon.output.count("event wait failed") == 1  # said once, not per failed wait
    # A GPU that falls off the bus fails the wait of its event set (GpuIsLost): the
    # others are watched again without it, it stays Unhealthy until it answers.
    eight.set_lost(6, True)
    kubelet.wait_until(
        lambda: "watching Xid events again without GPU(s) 6" in daemon.output, what=""
    )
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(6)], what="GPU 6 only"
    )
    eight.set_lost(6, False)
    kubelet.wait_for_resource(GPU, count=8)
    eight.inject_xid(6, 79)  # watched again since it came back
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(6)], what="GPU 6 Xid"
    )


def test_double_bit_ecc_and_the_drivers_recovery_action(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    """A double-bit ECC event needs a reset (Xid 48's workflow); the driver's recovery
    action asking for one and then no longer is how a reset shows."""
    daemon = kubelet.start_serve(config(eight, recoverySeconds=0.2), env=eight.env)
    kubelet.wait_for_resource(GPU, count=8)
    eight.inject_ecc(2)
    eight.set(2, recoveryAction=1)  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    kubelet.wait_until(lambda: "recovery action 1" in daemon.output, what="the action read")
    assert kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(2)]
    eight.set(2, recoveryAction=0)  # reset: nothing asked any more
    kubelet.wait_for_resource(GPU, count=8)
    assert "GPU 2 was reset (the driver no longer asks for a recovery action)" in daemon.output
    eight.inject_ecc(3, double_bit=False)  # single-bit: corrected, not watched
    eight.inject_xid(4, 63)  # row remapping: the catalog says IGNORE, so transient
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(4)], what="GPU 4"
    )
    kubelet.wait_for_resource(GPU, count=8)


def test_reset_check(kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path) -> None:
    marker = short_tmp / "reset"
    check = {"checks": [{"file": f"{marker}/{{id}}"}], "interval": 0.1}
    kubelet.start_serve(config(eight, resetCheck=check), env=eight.env)
    kubelet.wait_for_resource(GPU, count=8)
    eight.inject_xid(1, 119)  # GSP RPC timeout: RESET_GPU
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(1)], what="GPU 1"
    )
    marker.mkdir()
    (marker / gpu_uuid(0)).touch()  # another GPU's: changes nothing
    (marker / gpu_uuid(1)).touch()  # the reset tool says GPU 1 was reset
    kubelet.wait_for_resource(GPU, count=8)


def test_mig_devices_the_container_may_not_list(kubelet: KubeletHarness, short_tmp: Path) -> None:
    """NoPermission for MIG queries (no NVIDIA_MIG_MONITOR_DEVICES): one line says what
    to set; the GPU is not taken for missing and retried."""
    description = fake_host("gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb, 3g.20gb]}]")
    description["gpus"][0]["migAccess"] = False
    host = FakeGpuHost(short_tmp / "caps", description)
    daemon = kubelet.start_serve(
        config(host, migStrategy="mixed", retryMaxSeconds=0.05), env=host.env
    )
    kubelet.wait_for_resource(GPU, count=0)
    kubelet.wait_until(lambda: "NVIDIA_MIG_MONITOR_DEVICES=all" in daemon.output, what="")
    assert daemon.output.count("cannot be listed") == 1
    assert "cannot be used now" not in daemon.output


def test_a_stop_during_busy_health_reports_ends_the_daemon(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    """SIGTERM while the health thread reports all the time (a probe round every
    millisecond): the stop is never lost (Python 3.11's wait_for could swallow it)."""
    busy = {**FAST, "probeSeconds": 0.001}
    for _ in range(3):
        daemon = kubelet.start_serve(config(eight, **busy), env=eight.env)
        kubelet.wait_for_resource(GPU, count=8)
        assert daemon.stop() == 0, daemon.output[-2000:]
