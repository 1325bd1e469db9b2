"""NVIDIA's v0.20 config file read as NVIDIA's plugin reads it: keys matched by Go's
decoder (case-insensitive, unknown ones ignored, said in one warning each), the v0.20
key `sharedDevicesAllocationPolicy` and its placement of shared GPUs (distributed by
default, packed on request), IMEX channels, and what NVIDIA accepts and refuses.

The inputs are NVIDIA's own: the configs of its README and of api/config/v1's tests,
and the cases of internal/rm's allocation tests."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.gpus import fake_host, gpu_uuid
from devplug.fakes.nvml import FakeGpuHost
from devplug.testing import KubeletHarness
from tests.controlplane.test_nvidia_file import problem, spec_of

GPU = "nvidia.com/gpu"
UUID = "b1028956-cfa2-0990-bf4a-5da9abb51763"  # NVIDIA's example UUID
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 2}


# -- keys as Go's decoder matches them -----------------------------------------------------


def test_keys_of_plain_structs_match_whatever_their_case(tmp_path: Path) -> None:
    spec = spec_of(
        "VERSION: v1\nFlags:\n  MIGStrategy: mixed\n  failoninitError: false\n"
        "  plugin: {PassDeviceSpecs: true, deviceidstrategy: index,"
        " SharedDevicesAllocationPolicy: packed}\n",
        tmp_path,
    )
    assert spec.mig_strategy == "mixed"
    assert spec.fail_on_init_error is False
    assert spec.pass_device_specs is True
    assert spec.device_id_strategy == "index"
    assert spec.replica_policy == "packed"


def test_the_last_of_two_spellings_wins_as_in_go(tmp_path: Path) -> None:
    spec = spec_of("flags: {migStrategy: single, MigStrategy: mixed}\n", tmp_path)
    assert spec.mig_strategy == "mixed"


def test_unknown_keys_are_served_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "devplug.sources.nvidia")
    spec = spec_of(
        "version: v1\nflags:\n  migStrategy: none\n  extra: 1\n"
        "  plugin: {passDeviceSpec: true, futureFlag: x}\n"
        "sharing:\n  timeSlicing:\n    RenameByDefault: true\n"
        "    resources: [{name: gpu, replicas: 2, Replicas: 9, note: x}]\n",
        tmp_path,
    )
    assert spec.pass_device_specs is False  # a misspelt key is not a setting
    assert spec.rename_shared is False  # sharing's keys match only as spelled
    assert spec.resource_replicas == {GPU: 2}
    warnings = [r.getMessage() for r in caplog.records if "unknown key" in r.getMessage()]
    assert [w.split(": ")[1] for w in warnings] == [
        "flags.extra",
        "flags.plugin.passDeviceSpec",
        "flags.plugin.futureFlag",
        "sharing.timeSlicing.RenameByDefault",
        "sharing.timeSlicing.resources[0].Replicas",
        "sharing.timeSlicing.resources[0].note",
    ]
    assert all(w.startswith(str(tmp_path)) and "\n" not in w for w in warnings)


# -- NVIDIA's refusals and acceptances -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "flags: {plugin: {sharedDevicesAllocationPolicy: balanced}}\n",
            "flags.plugin.sharedDevicesAllocationPolicy: expected distributed or packed",
        ),
        ("imex: {channelIDs: [1]}\n", "imex.channelIDs: channelIDs must be [] or [0]; found [1]"),
        ("imex: {channelIDs: [0, 1]}\n", "channelIDs must be [] or [0]"),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [0, junk]}]}}\n",
            "sharing.timeSlicing.resources[0].devices[1]: unsupported device 'junk'",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [GPU-1]}]}}\n",
            "devices[0]: unsupported device 'GPU-1'",
        ),
        (
            "resources: {gpus: [{name: a100}]}\n",
            "resources.gpus[0]: resources must have a 'pattern' field set",
        ),
        (
            "resources: {mig: [{pattern: '*'}]}\n",
            "resources.mig[0]: resources must have a 'name' field set",
        ),
        (
            "resources: {gpus: [{pattern: '*', name: A100}]}\n",
            "resources.gpus[0].name: incorrect format for resource name 'nvidia.com/A100'",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: GPU, replicas: 2}]}}\n",
            "sharing.timeSlicing.resources[0].name: incorrect format for resource name",
        ),
    ],
)
def test_what_nvidia_refuses_is_refused_in_one_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in problem(text, tmp_path)


@pytest.mark.parametrize(
    "devices",
    [
        "all",
        3,
        [0, 1],
        ["0", "1:0"],
        [f"GPU-{UUID}"],
        [f"MIG-{UUID}", f"MIG-GPU-{UUID}/3/0"],
    ],
)
def test_the_device_lists_nvidia_takes_are_taken(tmp_path: Path, devices: Any) -> None:
    entry = {"name": "gpu", "replicas": 2, "devices": devices}
    text = yaml.safe_dump({"sharing": {"timeSlicing": {"resources": [entry]}}})
    assert spec_of(text, tmp_path).resource_replicas == {GPU: 2}


def test_envvar_and_volume_mounts_together_as_nvidia_allows(tmp_path: Path) -> None:
    spec = spec_of("flags: {plugin: {deviceListStrategy: [envvar, volume-mounts]}}\n", tmp_path)
    assert spec.device_list_strategy == ["envvar", "volume-mounts"]


def test_imex_channel_zero_and_required_are_read(tmp_path: Path) -> None:
    spec = spec_of("imex: {channelIDs: [0], required: true}\n", tmp_path)
    assert (spec.imex_channels, spec.imex_required) == ([0], True)
    assert spec_of("version: v1\n", tmp_path).imex_channels == []


# -- shared GPUs placed as NVIDIA places them ----------------------------------------------

SHARED_4 = """\
version: v1
flags:
  plugin: {policy}
sharing:
  timeSlicing:
    resources:
    - name: gpu
      replicas: 4
"""


@pytest.fixture
def four(short_tmp: Path) -> FakeGpuHost:
    return FakeGpuHost(short_tmp / "gpus", fake_host("gpus: [{model: H100-SXM5-80GB, count: 4}]"))


def serve_shared(kubelet: KubeletHarness, host: FakeGpuHost, folder: Path, policy: str) -> None:
    nvidia_file = folder / "nvidia.yaml"
    nvidia_file.write_text(SHARED_4.replace("{policy}", policy))
    ref = {"file": str(nvidia_file)}
    block = {"nvidia": {"hostRoot": host.host_root, **FAST, "nvidiaConfig": ref}}
    kubelet.start_serve({"resources": [block]}, env=host.env, wait=False)
    kubelet.wait_for_resource(GPU, count=16)


def gpu_of(pod: Any) -> str:
    [replica] = pod.devices()[GPU]
    return str(replica.partition("::")[0])


def test_by_default_a_replica_goes_to_the_gpu_with_fewest_in_use(
    kubelet: KubeletHarness, four: FakeGpuHost, short_tmp: Path
) -> None:
    serve_shared(kubelet, four, short_tmp, "{}")
    pods = [kubelet.admit({GPU: 1}) for _ in range(12)]
    assert Counter(gpu_of(p) for p in pods) == {gpu_uuid(i): 3 for i in range(4)}
    for pod in pods:  # GPU 0 keeps 3 of 4 replicas in use, the others none
        if gpu_of(pod) != gpu_uuid(0):
            assert kubelet.delete(pod)
    placed = [gpu_of(kubelet.admit({GPU: 1})) for _ in range(3)]
    assert sorted(placed) == [gpu_uuid(i) for i in (1, 2, 3)]  # never GPU 0


def test_packed_fills_the_busiest_gpu_first(
    kubelet: KubeletHarness, four: FakeGpuHost, short_tmp: Path
) -> None:
    serve_shared(kubelet, four, short_tmp, "{sharedDevicesAllocationPolicy: packed}")
    pods = [kubelet.admit({GPU: 1}) for _ in range(4)]
    assert len({gpu_of(p) for p in pods}) == 1  # four replicas of one GPU
    two = kubelet.admit({GPU: 2})
    assert len({r.partition("::")[0] for r in two.devices()[GPU]}) == 1


def test_an_imex_channel_reaches_the_container_as_from_nvidias_plugin(
    kubelet: KubeletHarness, four: FakeGpuHost, short_tmp: Path
) -> None:
    channel = Path(four.host_root) / "dev/nvidia-caps-imex-channels/channel0"
    channel.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(channel, stat.S_IFCHR | 0o666, os.makedev(234, 0))
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text(
        "version: v1\nflags: {plugin: {passDeviceSpecs: true}}\nimex: {channelIDs: [0]}\n"
    )
    block = {
        "nvidia": {"hostRoot": four.host_root, **FAST, "nvidiaConfig": {"file": str(nvidia_file)}}
    }
    kubelet.start_serve({"resources": [block]}, env=four.env, wait=False)
    kubelet.wait_for_resource(GPU, count=4)
    pod = kubelet.admit({GPU: 2})
    assert pod.env()["NVIDIA_IMEX_CHANNELS"] == "0"
    assert "/dev/nvidia-caps-imex-channels/channel0" in pod.device_nodes()


# -- MIG layouts NVIDIA's plugin refuses ---------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (
            "gpus: [{model: H100-SXM5-80GB, mig: [1g.10gb]}, {model: H100-SXM5-80GB}]",
            "devices with MIG enabled and disabled detected",
        ),
        (
            "gpus: [{model: H100-SXM5-80GB, mig: [3g.40gb, 1g.10gb]}]",
            "more than one MIG device type present on node",
        ),
    ],
)
def test_single_on_a_layout_nvidia_refuses_serves_no_gpu(
    kubelet: KubeletHarness, short_tmp: Path, layout: str, expected: str
) -> None:
    host = FakeGpuHost(short_tmp / "gpus", fake_host(layout))
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text("version: v1\nflags: {migStrategy: single, failOnInitError: false}\n")
    ref = {"file": str(nvidia_file)}
    block = {"nvidia": {"hostRoot": host.host_root, **FAST, "nvidiaConfig": ref}}
    process = kubelet.start_serve({"resources": [block]}, env=host.env, wait=False)
    kubelet.wait_until(lambda: expected in process.output, what="the refusal in the log")
    kubelet.wait_for_resource(GPU, count=0)
    assert not kubelet.admit({GPU: 1}).admitted  # a 1g slice is never given as a GPU


def test_single_with_fail_on_init_error_does_not_start(short_tmp: Path) -> None:
    host = FakeGpuHost(
        short_tmp / "gpus",
        fake_host("gpus: [{model: H100-SXM5-80GB, mig: [1g.10gb]}, {model: H100-SXM5-80GB}]"),
    )
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text("version: v1\nflags: {migStrategy: single}\n")
    done = subprocess.run(
        [sys.executable, "-m", "devplug.cli.nvidia_plugin", "--config-file", str(nvidia_file)],
        env={
            **os.environ,
            **host.env,
            "DEVPLUG_NVIDIA_OPTIONS": json.dumps({"hostRoot": host.host_root}),
            "KUBELET_SOCKET": str(short_tmp / "dp" / "kubelet.sock"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "invalid MIG configuration" in done.stderr
    assert "devices with MIG enabled and disabled detected" in done.stderr


def test_mixed_with_a_compute_instance_smaller_than_its_gpu_instance_is_refused(
    kubelet: KubeletHarness, short_tmp: Path
) -> None:
    host = FakeGpuHost(
        short_tmp / "gpus", fake_host("gpus: [{model: A100-SXM4-40GB, mig: [1c.2g.10gb]}]")
    )
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text("version: v1\nflags: {migStrategy: mixed, failOnInitError: false}\n")
    ref = {"file": str(nvidia_file)}
    block = {"nvidia": {"hostRoot": host.host_root, **FAST, "nvidiaConfig": ref}}
    process = kubelet.start_serve({"resources": [block]}, env=host.env, wait=False)
    kubelet.wait_until(
        lambda: (
            "MIG profile '1c.2g.10gb' of GPU 0 does not match any resource patterns"
            in process.output
        ),
        what="the refusal in the log",
    )


# NVIDIA's internal/rm allocation tests: (GPUs, replicas, size) -> replicas taken per GPU.
DISTRIBUTED_CASES = [(2, 4, 2, [1, 1]), (3, 2, 3, [1, 1, 1]), (2, 4, 4, [2, 2])]
PACKED_CASES = [(2, 4, 2, [2]), (3, 2, 3, [2, 1]), (2, 4, 4, [4]), (2, 4, 5, [4, 1])]


@pytest.mark.parametrize(
    ("policy", "cases"), [("distributed", DISTRIBUTED_CASES), ("packed", PACKED_CASES)]
)
def test_nvidias_allocation_cases_through_the_kubelet(
    kubelet: KubeletHarness, short_tmp: Path, policy: str, cases: list[Any]
) -> None:
    by_shape: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for gpus, replicas, size, counts in cases:
        by_shape.setdefault((gpus, replicas), []).append((size, counts))
    for (gpus, replicas), wanted in by_shape.items():
        folder = short_tmp / f"{policy}-{gpus}x{replicas}"
        folder.mkdir()
        host = FakeGpuHost(folder / "gpus", fake_host(f"gpus: [{{model: L4, count: {gpus}}}]"))
        nvidia_file = folder / "nvidia.yaml"
        nvidia_file.write_text(
            f"version: v1\nflags: {{plugin: {{sharedDevicesAllocationPolicy: {policy}}}}}\n"
            "sharing:\n  timeSlicing:\n    resources:\n"
            f"    - {{name: nvidia.com/gpu, replicas: {replicas}}}\n"
        )
        ref = {"file": str(nvidia_file)}
        block = {"nvidia": {"hostRoot": host.host_root, **FAST, "nvidiaConfig": ref}}
        process = kubelet.start_serve({"resources": [block]}, env=host.env, wait=False)
        kubelet.wait_for_resource(GPU, count=gpus * replicas)
        for size, counts in wanted:
            pod = kubelet.admit({GPU: size})
            taken = Counter(r.partition("::")[0] for r in pod.devices()[GPU])
            assert sorted(taken.values(), reverse=True) == counts, (policy, gpus, size)
            assert kubelet.delete(pod)
        process.stop()


def test_gds_with_cdi_only_is_taken_as_nvidia_takes_it(
    kubelet: KubeletHarness, four: FakeGpuHost, short_tmp: Path
) -> None:
    """NVIDIA accepts gdsEnabled with CDI strategies alone and sends NVIDIA_GDS=enabled;
    devplug does too, and says in one line that the CDI device of GDS is not written."""
    host_specs = Path(four.host_root) / "etc" / "cdi"
    host_specs.mkdir(parents=True)
    (host_specs / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"
    )
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text(
        "version: v1\nflags: {gdsEnabled: true, plugin: {deviceListStrategy: cdi-cri}}\n"
    )
    ref = {"file": str(nvidia_file)}
    entry = {"cdiDir": str(short_tmp / "cdi"), "nvidiaConfig": ref}
    block = {"nvidia": {"hostRoot": four.host_root, **FAST, **entry}}
    process = kubelet.start_serve({"resources": [block]}, env=four.env, wait=False)
    kubelet.wait_for_resource(GPU, count=4)
    pod = kubelet.admit({GPU: 1})
    assert pod.env() == {"NVIDIA_GDS": "enabled"}
    assert pod.cdi_devices() == [f"k8s.device-plugin.nvidia.com/gpu={pod.devices()[GPU][0]}"]
    assert "gdsEnabled with CDI strategies only" in process.output
