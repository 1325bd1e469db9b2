"""MIG as NVIDIA names and lays it out: the naming rule, the fake NVML's profile tables
and instance calls (checked against NVIDIA's published tables and nvml.h's errors), and
the geometry API a DRA partitions publisher reads."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from devplug.config.nvidia import NvidiaSpec
from devplug.fakes import nvml as nv
from devplug.fakes.gpumodels import MODELS
from devplug.fakes.gpus import FakeGpuHost, fake_host, gpu, mig_uuid
from devplug.sources.nvidia.discovery import resource_names
from devplug.sources.nvidia.mig import (
    MigGeometry,
    Placement,
    memory_gb,
    profile_name,
    resource_suffix,
)
from devplug.sources.nvidia.nvml import Nvml, NvmlView

MIG_MODELS = [key for key, m in MODELS.items() if m.mig]

# NVIDIA's names, as the MIG user guide and `nvidia-smi mig -lgip` on each GPU print them.
NVIDIA_NAMES = {
    "A100-SXM4-40GB": "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb",
    "A100-SXM4-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "H100-SXM5-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "H100-NVL-94GB": "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb",
    "H200-SXM5-141GB": "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
    "B200-180GB": "1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb",
}
# `nvidia-smi mig -lgipp` on these GPUs (the MIG user guide's "Getting Started").
LGIPP = {
    19: [(s, 1) for s in range(7)],
    20: [(s, 1) for s in range(7)],
    15: [(0, 2), (2, 2), (4, 2), (6, 2)],
    14: [(0, 2), (2, 2), (4, 2)],
    9: [(0, 4), (4, 4)],
    5: [(0, 4)],
    0: [(0, 8)],
}


def test_naming_rule() -> None:
    """go-nvlib's rule: the share of memory in eighths (rounded up) times the GPU's GB."""
    h200 = 143771 * 2**20
    assert memory_gb(16384, h200) == 18  # 16.00 GiB of 141: ceil(16/140.4 * 8) = 1 eighth
    assert memory_gb(16384, 0) == 16  # no total: the old reading of memory alone
    assert memory_gb(71168, h200) == 71  # 70.5, rounded half up (not to even)
    assert memory_gb(22528, 183359 * 2**20) == 23  # B200: 22.5 -> 23
    assert profile_name(0x0, None, 16384, h200) == "1g.18gb"
    assert profile_name(0x7, None, 9984, 81559 * 2**20) == "1g.10gb+me"
    assert profile_name(0x2, 1, 40448, 81559 * 2**20) == "1c.3g.40gb"
    assert profile_name(0xA, None, 23675, 97887 * 2**20) == "1g.24gb+gfx"
    assert profile_name(0xD, None, 23675, 97887 * 2**20) == "1g.24gb-me"
    assert profile_name(0xF, None, 23675, 97887 * 2**20) == "1g.24gb+me.all"
    assert resource_suffix("1g.10gb+me") == "mig-1g.10gb.me"
    assert resource_suffix("1g.24gb+me.all") == "mig-1g.24gb.me.all"
    with pytest.raises(ValueError, match="unknown GPU instance profile"):
        profile_name(99, None, 1, 1)


@pytest.fixture
def nvml(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Nvml, FakeGpuHost]]:
    description = {
        "driver": {},
        "gpus": [gpu(i, model_key=key) for i, key in enumerate(MIG_MODELS)],
        "events": [],
    }
    for entry in description["gpus"]:
        entry["migMode"] = 1
    host = FakeGpuHost(short_tmp / "mig", description)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    lib = Nvml()
    lib.start()
    lib.read()
    yield lib, host
    lib.stop()


def test_every_table_gives_nvidias_names_and_placements(nvml: tuple[Nvml, FakeGpuHost]) -> None:
    lib, _ = nvml
    for index, key in enumerate(MIG_MODELS):
        geometry = lib.mig_geometry(index)
        by_id = {p.id: p for p in geometry.profiles}
        names = [by_id[pid].name for pid in (19, 20, 15, 14, 9, 5, 0)]
        assert names == NVIDIA_NAMES[key].split(), key
        for pid, placements in LGIPP.items():
            assert [(p.start, p.size) for p in by_id[pid].placements] == placements, key
        assert geometry.memory_slices == 8
        assert [by_id[pid].instances for pid in (19, 20, 15, 14, 9, 5, 0)] == [7, 1, 4, 3, 2, 1, 1]


def test_mig_devices_are_named_by_nvidias_rule(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H200: 1g.18gb, not the 1g.16gb that its 16 GiB would give alone; the +me profile
    is its own name; a compute instance of part of its GPU instance says so."""
    host = FakeGpuHost(
        short_tmp / "h200",
        fake_host(
            "gpus: [{model: H200-SXM5-141GB, mig: [1c.3g.71gb, 2g.35gb, 1g.18gb+me, 1g.18gb]}]"
        ),
    )
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    lib = Nvml()
    lib.start()
    try:
        [g] = lib.read().gpus
    finally:
        lib.stop()
    assert sorted(m.profile for m in g.migs) == ["1c.3g.71gb", "1g.18gb", "1g.18gb+me", "2g.35gb"]
    assert {m.profile: m.multiprocessors for m in g.migs}["1c.3g.71gb"] == 20
    # Mixed: each under its exact profile, the part of a GPU instance included.
    view = NvmlView("550.54.15", "12.4", (g,))
    spec = NvidiaSpec(mig_strategy="mixed")
    assert resource_names(view, "nvidia.com/gpu", spec) == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1c.3g.71gb",
        "nvidia.com/mig-1g.18gb",
        "nvidia.com/mig-1g.18gb.me",
        "nvidia.com/mig-2g.35gb",
    ]


def test_instances_as_the_driver_makes_them(nvml: tuple[Nvml, FakeGpuHost]) -> None:
    """Create and destroy GPU and compute instances through the NVML calls, with the
    errors nvml.h lists for each."""
    lib, host = nvml
    a100 = nv.nvmlDeviceGetHandleByIndex(MIG_MODELS.index("A100-SXM4-40GB"))
    count = ctypes.c_uint()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(a100, 9, None, ctypes.byref(count))
    assert count.value == 2
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19) == 7
    # The MIG user guide's examples: a 3g.20gb takes the upper half as GPU instance 2,
    # a 1g.5gb then slice 3 as instance 10 (7 + its start).
    three = nv.nvmlDeviceCreateGpuInstance(a100, 9)
    info = nv.nvmlGpuInstanceGetInfo(three)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (2, 9, 4, 4)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19) == 4
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 9) == 1
    placement = nv.c_nvmlGpuInstancePlacement_t(4, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # taken
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, ctypes.byref(placement))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not a placement of 3g
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(
            a100, 9, ctypes.byref(nv.c_nvmlGpuInstancePlacement_t(2, 4))
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # no such profile
        nv.nvmlDeviceCreateGpuInstance(a100, 42)
    one = nv.nvmlDeviceCreateGpuInstanceWithPlacement(
        a100, 19, ctypes.byref(nv.c_nvmlGpuInstancePlacement_t(3, 1))
    )
    assert nv.nvmlGpuInstanceGetInfo(one).id == 10
    me = nv.nvmlDeviceCreateGpuInstance(a100, 20)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # one +me at a time
        nv.nvmlDeviceCreateGpuInstance(a100, 20)
    # Compute instances: the 3g.20gb offers 1c (3), 2c (1), 3c (1).
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no 4c in a 3g instance
        nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(three, 3, 0)
    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(three, 0, 0)
    assert (ci_info.sliceCount, ci_info.instanceCount, ci_info.name) == (1, 3, "MIG 1c.3g.20gb")
    small = nv.nvmlGpuInstanceCreateComputeInstance(three, 0)
    nv.nvmlGpuInstanceCreateComputeInstance(three, 0)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # 2c needs 0-1: taken
        nv.nvmlGpuInstanceCreateComputeInstance(three, 1)
    assert nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(three, 0) == 1
    with pytest.raises(pynvml.NVMLError_InUse):  # compute instances are active on it
        nv.nvmlGpuInstanceDestroy(three)
    # Another process (the daemon) sees the driver's state: the description changed.
    host.reload()
    assert len(host.gpu(MIG_MODELS.index("A100-SXM4-40GB"))["gpuInstances"]) == 3
    geometry = lib.mig_geometry(MIG_MODELS.index("A100-SXM4-40GB"))
    assert [(i.id, i.placement) for i in geometry.instances] == [
        (2, Placement(4, 4)),
        (9, Placement(2, 1)),  # the +me: the highest free slice
        (10, Placement(3, 1)),
    ]
    assert [c.name for c in geometry.instances[0].compute_instances] == ["1c.3g.20gb"] * 2
    assert [p.start for p in geometry.free_placements(geometry.profile("1g.5gb"))] == [0, 1]
    assert geometry.free_placements(geometry.profile("1g.5gb+me")) == []  # its one is used
    assert geometry.free_placements(geometry.profile("4g.20gb")) == []  # overlaps
    nv.nvmlComputeInstanceDestroy(small)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a destroyed handle
        nv.nvmlComputeInstanceGetInfo(small)
    for handle in (one, me):  # no compute instance: they go
        nv.nvmlGpuInstanceDestroy(handle)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a destroyed handle
            nv.nvmlGpuInstanceGetInfo(handle)


def test_without_mig_mode(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML on a GPU without MIG mode: zero MIG devices (not 7), NotSupported for
    instances, NotFound/InvalidArgument for slots as nvml.h says."""
    host = FakeGpuHost(
        short_tmp / "off",
        fake_host("gpus: [{model: H100-SXM5-80GB}, {model: L4}, {model: A100-SXM4-40GB, mig: []}]"),
    )
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    nv.nvmlInit()
    try:
        off, l4, empty = (nv.nvmlDeviceGetHandleByIndex(i) for i in range(3))
        assert nv.nvmlDeviceGetMaxMigDeviceCount(off) == 0
        assert nv.nvmlDeviceGetMaxMigDeviceCount(l4) == 0
        assert nv.nvmlDeviceGetMaxMigDeviceCount(empty) == 7
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nv.nvmlDeviceGetMigMode(l4)
        assert nv.nvmlDeviceGetMigMode(off) == [0, 0]
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nv.nvmlDeviceCreateGpuInstance(off, 19)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nv.nvmlDeviceGetGpuInstanceProfileInfo(off, 0)
        with pytest.raises(pynvml.NVMLError_NotFound):
            nv.nvmlDeviceGetMigDeviceHandleByIndex(empty, 0)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nv.nvmlDeviceGetMigDeviceHandleByIndex(empty, 7)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nv.nvmlDeviceGetGpuInstanceProfileInfo(empty, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # a profile the A100 lacks
            nv.nvmlDeviceGetGpuInstanceProfileInfo(empty, 0xA)
        with pytest.raises(pynvml.NVMLError_NotFound):
            nv.nvmlDeviceGetGpuInstanceById(empty, 3)
    finally:
        nv.nvmlShutdown()


def test_host_descriptions_from_yaml() -> None:
    description = fake_host(
        """
        gpus:
          - model: H100-SXM5-80GB
            count: 8
            numa: [0, 0, 0, 0, 1, 1, 1, 1]
            mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]
        nvlink: all
        """
    )
    gpus = description["gpus"]
    assert len(gpus) == 8
    assert [g["numa"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    layout = [(gi["profile"], gi["start"]) for gi in gpus[7]["gpuInstances"]]
    assert layout == [(9, 4), (14, 2), (19, 1), (19, 0)]  # as NVML placed them
    assert gpus[7]["gpuInstances"][0]["computeInstances"][0]["uuid"] == mig_uuid(7, 2)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # does not fit
        fake_host("gpus: [{model: A100-SXM4-40GB, mig: [4g.20gb, 4g.20gb]}]")
    with pytest.raises(KeyError, match="unknown GPU model"):
        fake_host("gpus: [{model: H800}]")


def test_geometry_is_plain_values() -> None:
    geometry = MigGeometry(0, "GPU-x", (), ())
    assert geometry.memory_slices == 0
    with pytest.raises(KeyError):
        geometry.profile("1g.10gb")


def test_mig_without_the_monitor_capability(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container without NVIDIA_MIG_MONITOR_DEVICES NVML answers NoPermission for
    MIG queries: the GPU is seen, with one line saying why its MIG devices are not, and
    is not taken for a GPU that is missing."""
    description = fake_host("gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb, 3g.20gb]}]")
    description["gpus"][0]["migAccess"] = False
    host = FakeGpuHost(short_tmp / "caps", description)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    lib = Nvml()
    lib.start()
    try:
        view = lib.read()
        with pytest.raises(pynvml.NVMLError_NoPermission):
            lib.mig_geometry(0)
    finally:
        lib.stop()
    assert view.missing == ()
    [g] = view.gpus
    assert g.migs == ()
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in g.mig_problem
    assert "NoPermission" in g.mig_problem


def test_the_nodes_are_real_and_their_host_paths_follow_dev_root(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake host's nodes are character devices with the driver's numbers, so a
    container runtime can apply them; with `devRoot` (or --dev-root) a MIG device's
    nodes are found there on the host and stay `/dev/...` in the container."""
    import json
    import os
    import stat

    import yaml

    from devplug.config.nvidia import NvidiaSpec
    from devplug.fakes.devnodes import CONTROL_MINOR, NVIDIA_MAJOR, driver_major
    from devplug.sources.nvidia.discovery import units
    from tests.controlplane.test_dra_config import devplug
    from tests.process.test_nvidia_units import loaded, read_view

    host = FakeGpuHost(
        short_tmp / "h", fake_host("gpus: [{model: A100-SXM4-40GB, mig: [3g.20gb]}]")
    )
    dev = Path(host.dev_root)
    minors = (Path(host.host_root) / "proc/driver/nvidia-caps/mig-minors").read_text().split()
    [made] = host.gpu(0)["gpuInstances"]
    key = f"gpu0/gi{made['id']}"
    gi = int(minors[minors.index(f"{key}/access") + 1])
    ci = int(minors[minors.index(f"{key}/ci{made['computeInstances'][0]['id']}/access") + 1])
    numbers = {
        "nvidia0": (NVIDIA_MAJOR, 0),
        "nvidiactl": (NVIDIA_MAJOR, CONTROL_MINOR),
        "nvidia-uvm": (driver_major("nvidia-uvm"), 0),
        "nvidia-uvm-tools": (driver_major("nvidia-uvm"), 1),
        f"nvidia-caps/nvidia-cap{gi}": (driver_major("nvidia-caps"), gi),
        f"nvidia-caps/nvidia-cap{ci}": (driver_major("nvidia-caps"), ci),
    }
    for name, number in numbers.items():
        info = (dev / name).stat()
        assert stat.S_ISCHR(info.st_mode), name
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == number, name
    assert not (dev / "nvidia-modeset").exists()  # not on this host: not passed

    loaded(host, monkeypatch)
    view = read_view()
    spec = NvidiaSpec(host_root=host.host_root, mig_strategy="mixed")
    [mig] = [u for u in units(view, "nvidia.com/gpu", spec, host.dev_root)[0] if u.mig]
    nodes = {n.container_path: n.host_path for n in mig.nodes}
    assert nodes == {f"/dev/{name}": str(dev / name) for name in numbers}

    # The config's devRoot and --dev-root reach the source (the flag wins).
    entry = {"nvidia": {"hostRoot": host.host_root, "migStrategy": "mixed"}}
    config = short_tmp / "c.yaml"
    for document, flags, where in (
        ({}, (), Path("/dev")),
        ({"devRoot": str(dev)}, (), dev),
        ({"devRoot": "/elsewhere"}, ("--dev-root", str(dev)), dev),
    ):
        config.write_text(yaml.safe_dump({**document, "resources": [entry]}))
        result = devplug("check", "--config", config, *flags, "--output", "json", env=host.env)
        assert result.returncode == 0, result.stderr
        found = {r["name"]: r for r in json.loads(result.stdout)["resources"]}
        [device] = found["nvidia.com/mig-3g.20gb"]["devices"]
        assert sorted(device["hostPaths"]) == sorted(str(where / name) for name in numbers)
