"""The config files of NVIDIA's README (k8s-device-plugin v0.20.0), served as they are
through `nvidia-device-plugin --config-file` on the fake NVML: the resources, Allocate
answers and labels NVIDIA's README says each gives. The files are NVIDIA's, key for
key; the expectations are the README's own words about them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devplug.fakes.gpus import fake_host
from devplug.fakes.mps import script
from devplug.fakes.nvml import FakeGpuHost, eight_gpus
from devplug.outputs.nfd import parse_features
from devplug.testing import KubeletHarness
from devplug.testing.harness import PluginProcess

# "Configuration file" section: the file that sets NVIDIA's defaults explicitly.
DEFAULTS = """\
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
"""
# "Shared Access to GPUs with CUDA Time-Slicing": 10 replicas of every GPU.
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
# ...and with renameByDefault: the shared GPUs advertised as nvidia.com/gpu.shared.
TIME_SLICING_RENAMED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
# "Shared Access to GPUs with CUDA MPS".
MPS = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
# "Deploying with gpu-feature-discovery for automatic node labels": config1.yaml.
MIXED = """\
version: v1
flags:
  migStrategy: "mixed" # Only change from config0.yaml
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
"""


def start(
    kubelet: KubeletHarness, host: FakeGpuHost, folder: Path, text: str, **options: Any
) -> PluginProcess:
    config = folder / "config.yaml"
    config.write_text(text)
    options = {"hostRoot": host.host_root, "probeSeconds": 0.05, **options}
    return kubelet.start_module(
        "devplug.cli.nvidia_plugin",
        "--config-file",
        str(config),
        "--kubelet-socket",
        str(kubelet.plugin_dir / "kubelet.sock"),
        env={**host.env, "DEVPLUG_NVIDIA_OPTIONS": json.dumps(options)},
    )


@pytest.fixture
def eight(short_tmp: Path) -> FakeGpuHost:
    return FakeGpuHost(short_tmp / "gpus", eight_gpus())


def test_the_defaults_file_serves_each_gpu_once_by_uuid_without_device_specs(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    start(kubelet, eight, short_tmp, DEFAULTS)
    kubelet.wait_for_resource("nvidia.com/gpu", count=8)
    pod = kubelet.admit({"nvidia.com/gpu": 2})
    uuids = pod.devices()["nvidia.com/gpu"]
    assert pod.env() == {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    assert pod.device_nodes() == {}  # passDeviceSpecs: false


@pytest.mark.parametrize(
    ("text", "resource", "product"),
    [
        # "the nvidia.com/gpu resource ... each of which can be shared by up to 10 pods"
        (TIME_SLICING, "nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3-SHARED"),
        # renameByDefault: "nvidia.com/gpu.shared", and the product label loses -SHARED
        (TIME_SLICING_RENAMED, "nvidia.com/gpu.shared", "NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_time_slicing_examples_advertise_ten_replicas_of_each_gpu(
    kubelet: KubeletHarness,
    eight: FakeGpuHost,
    short_tmp: Path,
    text: str,
    resource: str,
    product: str,
) -> None:
    features = short_tmp / "features"
    config = short_tmp / "config.yaml"
    config.write_text(text)
    options = {"hostRoot": eight.host_root, "probeSeconds": 0.05}
    kubelet.start_serve(
        {
            "nodeFeatures": {"path": str(features)},
            "resources": [{"nvidia": {**options, "nvidiaConfig": {"file": str(config)}}}],
        },
        env=eight.env,
        wait=False,
    )
    kubelet.wait_for_resource(resource, count=80)
    # Time-slicing does not refuse more than one replica unless asked to.
    two = kubelet.admit({resource: 2})
    assert two.admitted, two.message
    kubelet.wait_until(features.exists, what="the labels")
    labels = parse_features(features.read_text())
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["nvidia.com/gpu.replicas"] == "10"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_the_mps_example_gives_one_replica_through_the_resources_daemon(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    mps = {"root": str(short_tmp / "mps"), "control": str(script(short_tmp / "bin"))}
    process = start(kubelet, eight, short_tmp, MPS, mps=mps)
    try:
        kubelet.wait_for_resource("nvidia.com/gpu", count=80)
        pod = kubelet.admit({"nvidia.com/gpu": 1})
        assert pod.env()["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
        # "a request for more than one ... replica is refused": failRequestsGreaterThanOne
        two = kubelet.admit({"nvidia.com/gpu": 2})
        assert not two.admitted
    finally:
        assert process.stop() == 0  # and its daemon with it


def test_the_mixed_example_serves_each_mig_profile_by_name(
    kubelet: KubeletHarness, short_tmp: Path
) -> None:
    host = FakeGpuHost(
        short_tmp / "gpus",
        fake_host("gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb, 2g.10gb, 1g.5gb]}]"),
    )
    start(kubelet, host, short_tmp, MIXED)
    for profile in ("3g.20gb", "2g.10gb", "1g.5gb"):
        kubelet.wait_for_resource(f"nvidia.com/mig-{profile}", count=1)
    pod = kubelet.admit({"nvidia.com/mig-1g.5gb": 1})
    [uuid] = pod.devices()["nvidia.com/mig-1g.5gb"]
    assert pod.env() == {"NVIDIA_VISIBLE_DEVICES": uuid}
    assert uuid.startswith("MIG-")
