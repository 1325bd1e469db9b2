"""Node labels computed as NVIDIA's GPU feature discovery computes them, checked through
`devplug gpus --output json` on fake hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devplug.fakes.gpus import FakeGpuHost, fake_host


def labels_of(
    tmp: Path, host_yaml: str, prepare: Callable[[Path], None] | None = None, **nvidia: Any
) -> dict[str, str]:
    """The labels `devplug gpus` gives on a fake host (`prepare` adds to its root)."""
    host = FakeGpuHost(tmp, fake_host(host_yaml))
    if prepare is not None:
        prepare(Path(host.host_root))
    config = tmp / "devplug.yaml"
    config.write_text(
        yaml.safe_dump({"resources": [{"nvidia": {"hostRoot": host.host_root, **nvidia}}]})
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "gpus",
            "--config",
            str(config),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **host.env},
    )
    assert result.returncode == 0, result.stderr
    [source] = json.loads(result.stdout)["sources"]
    labels: dict[str, str] = source["labels"]
    return labels


def test_families_by_compute_capability(short_tmp: Path) -> None:
    expected = {
        "L4": "ada-lovelace",  # 8.9
        "L40S": "ada-lovelace",
        "A10": "ampere",  # 8.6
        "T4": "turing",  # 7.5
        "H100-SXM5-80GB": "hopper",
        "B200-180GB": "blackwell",  # 10.0
        "RTX-PRO-6000": "blackwell",  # 12.0
    }
    for key, family in expected.items():
        labels = labels_of(short_tmp / key, f"gpus: [{{model: {key}}}]")
        assert labels["nvidia.com/gpu.family"] == family, key


def test_mig_mixed_labels_carry_the_attributes(short_tmp: Path) -> None:
    labels = labels_of(
        short_tmp / "mixed",
        "gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb, 1g.5gb+me, 1g.5gb]}, "
        "{model: A100-SXM4-40GB, mig: [3g.20gb]}]",
        migStrategy="mixed",
    )
    resource = "nvidia.com/mig-3g.20gb"
    assert labels[f"{resource}.count"] == "2"
    assert labels[f"{resource}.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert labels[f"{resource}.memory"] == "20096"
    assert labels[f"{resource}.multiprocessors"] == "42"
    assert (labels[f"{resource}.slices.gi"], labels[f"{resource}.slices.ci"]) == ("3", "3")
    assert labels[f"{resource}.engines.copy"] == "3"
    assert labels[f"{resource}.engines.decoder"] == "2"
    assert labels[f"{resource}.sharing-strategy"] == "none"
    me = "nvidia.com/mig-1g.5gb.me"
    assert labels[f"{me}.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert (labels[f"{me}.engines.jpeg"], labels[f"{me}.engines.ofa"]) == ("1", "1")
    assert labels["nvidia.com/mig.strategy"] == "mixed"


def test_mig_single_invalid_layouts(short_tmp: Path) -> None:
    """GFD's -MIG-INVALID labels for what `migStrategy: single` cannot serve."""
    layouts = {
        "two profiles": "gpus: [{model: H100-SXM5-80GB, mig: [3g.40gb, 2g.20gb]}]",
        "empty": "gpus: [{model: H100-SXM5-80GB, mig: [1g.10gb]}, "
        "{model: H100-SXM5-80GB, mig: []}]",
        "mixed modes": "gpus: [{model: H100-SXM5-80GB, mig: [1g.10gb]}, {model: H100-SXM5-80GB}]",
    }
    for name, layout in layouts.items():
        labels = labels_of(short_tmp / name.replace(" ", "-"), layout, migStrategy="single")
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID", name
        assert labels["nvidia.com/gpu.count"] == "0", name
        assert (labels["nvidia.com/gpu.memory"], labels["nvidia.com/gpu.replicas"]) == ("0", "0")
    good = labels_of(
        short_tmp / "good",
        "gpus: [{model: H200-SXM5-141GB, mig: [1g.18gb, 1g.18gb]}]",
        migStrategy="single",
    )
    assert good["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert good["nvidia.com/gpu.count"] == "2"
    assert good["nvidia.com/gpu.slices.gi"] == "1"


def test_sharing_and_mode_labels(short_tmp: Path) -> None:
    shared = labels_of(
        short_tmp / "mps", "gpus: [{model: L4, count: 2}]", replicas=4, sharing="mps"
    )
    assert shared["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert shared["nvidia.com/mps.capable"] == "true"
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert shared["nvidia.com/gpu.count"] == "2"
    sliced = labels_of(short_tmp / "ts", "gpus: [{model: L4}]", replicas=2)
    assert sliced["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert sliced["nvidia.com/mps.capable"] == "false"
    assert sliced["nvidia.com/gpu.machine"] == "unknown"  # no DMI product name here


def test_mig_enabled_gpus_are_labelled_without_sharing_as_gfd_does(short_tmp: Path) -> None:
    """GFD labels MIG-enabled GPUs without their sharing: replicas 0, strategy none, no
    -SHARED, even where time-slicing is configured (internal/lm: newGPULabelers)."""
    labels = labels_of(
        short_tmp / "mig",
        "gpus: [{model: A100-SXM4-40GB, count: 2, mig: [3g.20gb]}]",
        migStrategy="mixed",
        replicas=4,
    )
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "2"
    # A GPU without MIG wins over the MIG-enabled ones, with its sharing.
    mixed = labels_of(
        short_tmp / "some",
        "gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb]}, {model: A100-SXM4-40GB}]",
        migStrategy="mixed",
        replicas=4,
    )
    assert mixed["nvidia.com/gpu.replicas"] == "4"
    assert mixed["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"


def test_gpu_count_is_of_one_model_on_a_mixed_node(short_tmp: Path) -> None:
    labels = labels_of(short_tmp / "two", "gpus: [{model: L4, count: 2}, {model: H100-SXM5-80GB}]")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels["nvidia.com/gpu.count"] == "2"  # GFD counts the labelled model's GPUs


def test_gpu_clique_from_the_nvlink_fabric_as_gfd_labels_it(short_tmp: Path) -> None:
    cluster = "6e1c2c9a-3f4b-4d2e-9a7b-0c1d2e3f4a5b"
    fabric = f"{{clusterUuid: {cluster}, cliqueId: 32766}}"
    labels = labels_of(
        short_tmp / "nvl", f"gpus: [{{model: H100-SXM5-80GB, count: 4, fabric: {fabric}}}]"
    )
    assert labels["nvidia.com/gpu.clique"] == f"{cluster}.32766"
    # Registration not completed (state 2: in progress): no clique, as GFD.
    pending = f"{{clusterUuid: {cluster}, cliqueId: 1, state: 2}}"
    labels = labels_of(
        short_tmp / "pending", f"gpus: [{{model: H100-SXM5-80GB, fabric: {pending}}}]"
    )
    assert "nvidia.com/gpu.clique" not in labels
    assert "nvidia.com/gpu.clique" not in labels_of(short_tmp / "none", "gpus: [{model: L4}]")


def config_space(host_driver: tuple[str, str] | None) -> bytes:
    """A GPU's 256-byte PCI config space, with a vGPU host's vendor capability."""
    config = bytearray(256)
    config[0:2] = b"\xde\x10"
    if host_driver is not None:
        config[0x06] = 0x10  # a capability list
        config[0x34] = 0x40
        version, branch = (v.encode().ljust(10, b"\0") for v in host_driver)
        record = bytes([0, 22]) + version + branch
        capability = bytes([0x09, 0x00, 5 + len(record)]) + b"VF" + record
        config[0x40 : 0x40 + len(capability)] = capability
    return bytes(config)


def test_vgpu_labels_from_the_pci_config_space_as_gfd_reads_it(short_tmp: Path) -> None:
    def host_with(config: bytes, name: str) -> dict[str, str]:
        def pci(root: Path) -> None:
            device = root / "sys/bus/pci/devices/0000:18:00.0"  # the GPU's
            device.mkdir(parents=True, exist_ok=True)
            (device / "vendor").write_text("0x10de\n")
            (device / "config").write_bytes(config)

        return labels_of(short_tmp / name, "gpus: [{model: L4}]", pci)

    vgpu = host_with(config_space(("550.54.15", "r550_00")), "vgpu")
    assert vgpu["nvidia.com/vgpu.present"] == "true"
    assert vgpu["nvidia.com/vgpu.host-driver-version"] == "550.54.15"
    assert vgpu["nvidia.com/vgpu.host-driver-branch"] == "r550_00"
    bare = host_with(config_space(None), "bare")
    assert bare["nvidia.com/vgpu.present"] == "false"
    # Unprivileged, sysfs gives the first 64 bytes: GFD writes no vGPU label then.
    assert "nvidia.com/vgpu.present" not in host_with(config_space(None)[:64], "short")
