"""MIG through DRA partitions on the fake NVML (NVIDIA's MIG tables, NVML's errors):
every profile at every placement of a GPU in MIG mode published as a partition of the
GPU's memory slices; the instances made when a claim is prepared and destroyed when it
is unprepared by the real daemon, for the simulator's kubelet; MIG mode never changed;
instances devplug did not make left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.gpumodels import MODELS
from devplug.fakes.gpus import FakeGpuHost, gpu, gpu_uuid
from devplug.simulator.results import REASON_UNSCHEDULABLE
from devplug.sources import ConfigError, parse_config
from tests.dra_helpers import NODE, Daemon, NodeDirs, kubelet_for, serve_command
from tests.process.test_dra_partitions_node import claim, pod, prepare, unprepare

DRIVER = "gpu.devplug.io"
A100 = "A100-SXM4-40GB"


def mig_host(folder: Path, model: str = A100, mig: list[str] | None = None) -> FakeGpuHost:
    """GPU 0 of `model` in MIG mode (with the `mig` instances), GPU 1 with MIG off."""
    gpus = [gpu(0, model_key=model, mig=mig or []), gpu(1, model_key=model)]
    return FakeGpuHost(folder, {"driver": {"loaded": True}, "gpus": gpus, "events": []})


def mig_config(folder: Path, host: FakeGpuHost) -> Path:
    entry = {
        "nvidia": {"hostRoot": host.host_root},
        "mode": "dra",
        "dra": {"driver": DRIVER, "partitions": {"mig": True}},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"resources": [entry]}))
    return path


def published(config: Path, host: FakeGpuHost) -> list[dict[str, Any]]:
    """The slices `devplug check` shows for the config."""
    from tests.controlplane.test_dra_config import devplug

    result = devplug(
        "check", "--config", config, "--node-name", NODE, "--output", "json", env=host.env
    )
    assert result.returncode == 0, result.stderr
    [resource] = json.loads(result.stdout)["resources"]
    bodies: list[dict[str, Any]] = resource["slices"]
    return bodies


def devices_of(bodies: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for b in bodies for d in b["spec"].get("devices", [])}


def counter_sets(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for b in bodies for s in b["spec"].get("sharedCounters", [])]


@pytest.mark.parametrize("model", sorted(k for k, m in MODELS.items() if m.mig))
def test_every_profile_and_placement_is_a_partition(model: str, short_tmp: Path) -> None:
    host = mig_host(short_tmp / "host", model)
    bodies = published(mig_config(short_tmp, host), host)
    [counters] = counter_sets(bodies)
    table = MODELS[model]
    slices = max(p.start + p.size for r in table.mig for p in _placements(r))
    assert {f"memory-slice-{i}" for i in range(slices)} <= set(counters["counters"])
    assert counters["counters"]["memory"] == {"value": str(table.memory)}
    assert len(counters["counters"]) <= 32
    devices = devices_of(bodies)
    migs = {n: d for n, d in devices.items() if "migProfile" in d.get("attributes", {})}
    assert len(migs) == sum(len(_placements(r)) for r in table.mig)
    for device in migs.values():
        [use] = device["consumesCounters"]
        assert use["counterSet"] == counters["name"]
        start = device["attributes"]["migPlacement"]["int"]
        taken = {k for k in use["counters"] if k.startswith("memory-slice-")}
        profile = device["attributes"]["migProfile"]["string"]
        [row] = [r for r in table.mig if r.name == profile]
        size = next(p.size for p in _placements(row) if p.start == start)
        assert taken == {f"memory-slice-{i}" for i in range(start, start + size)}
        memory = int(use["counters"]["memory"]["value"])
        assert memory == int(device["capacity"]["memory"]["value"]) <= table.memory
    # GPU 1 has MIG off: offered whole, consuming nothing.
    [whole] = [d for d in devices.values() if "migProfile" not in d.get("attributes", {})]
    assert whole["attributes"]["uuid"] == {"string": gpu_uuid(1)}
    assert "consumesCounters" not in whole
    assert all(len(b["spec"].get("devices", [])) <= 64 for b in bodies)


def _placements(row: Any) -> list[Any]:
    from devplug.sources.nvidia.mig import Placement

    return [Placement(start, size) for start, size in row.placements]


def test_mig_partitions_need_an_nvidia_entry() -> None:
    text = yaml.safe_dump(
        {
            "resources": [
                {
                    "name": "example.com/acc",
                    "virtual": 1,
                    "mode": "dra",
                    "dra": {"partitions": {"mig": True}},
                }
            ]
        }
    )
    with pytest.raises(ConfigError, match=r"resources\[0\]\.dra\.partitions\.mig: only for an"):
        parse_config(text, "c.yaml")


def mig_name(profile: str, start: int) -> str:
    """The slice name of a partition of GPU 0."""
    from devplug.framework.dra.layout import partition_id
    from devplug.kube.dranames import device_name
    from devplug.sources.nvidia.partitions import _NOT_LABEL

    label = _NOT_LABEL.sub("-", profile.lower()).strip("-")
    return device_name(partition_id(gpu_uuid(0), f"mig-{label}-{start}"))


def instances(host: FakeGpuHost) -> list[tuple[int, int]]:
    host.reload()
    return sorted((g["start"], g["size"]) for g in host.gpu(0).get("gpuInstances", []))


async def test_a_partition_is_made_at_prepare_and_destroyed_at_unprepare(short_tmp: Path) -> None:
    dirs = NodeDirs(short_tmp)
    host = mig_host(dirs.root / "host")
    config = mig_config(dirs.root, host)
    three = claim(dirs, "three", DRIVER, {"device": mig_name("3g.20gb", 0)})
    one = claim(dirs, "one", DRIVER, {"device": mig_name("1g.5gb", 4)})
    claim(dirs, "overlap", DRIVER, {"device": mig_name("1g.5gb", 2)})

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log", host.env)
        try:
            await kubelet.wait_for_registration(DRIVER)
            [first] = await kubelet.apply(pod("p-three", "three"))
            assert first.admitted, first.message
            assert instances(host) == [(0, 4)]
            spec = json.loads((dirs.cdi / f"{DRIVER}-{three}.json").read_text())
            [made] = host.gpu(0)["gpuInstances"]
            [compute] = made["computeInstances"]
            assert f"NVIDIA_VISIBLE_DEVICES={compute['uuid']}" in spec["containerEdits"]["env"]
            caps = [
                n["path"]
                for n in spec["containerEdits"].get("deviceNodes", [])
                if "nvidia-caps" in n["path"]
            ]
            assert len(caps) == 2  # the GPU instance's and the compute instance's
            [device] = spec["devices"]
            nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
            assert "/dev/nvidia0" in nodes

            [second] = await kubelet.apply(pod("p-one", "one"))
            assert second.admitted, second.message
            assert instances(host) == [(0, 4), (4, 1)]
            assert json.loads((dirs.cdi / f"{DRIVER}-{one}.json").read_text())

            # Memory slice 2 is in the 3g.20gb: never allocated, never made.
            [third] = await kubelet.apply(pod("p-overlap", "overlap"))
            assert (third.admitted, third.reason) == (False, REASON_UNSCHEDULABLE)
            errors = await prepare(dirs, DRIVER, "overlap")
            assert "overlaps" in errors["overlap"]
            assert instances(host) == [(0, 4), (4, 1)]

            assert await kubelet.delete_pod("p-three")
            assert instances(host) == [(4, 1)]
            assert host.gpu(0)["migMode"] == 1  # never changed
            assert host.gpu(1)["migMode"] == 0
            [again] = await kubelet.apply(pod("p-overlap", "overlap"))
            assert again.admitted, again.message
            assert instances(host) == [(2, 1), (4, 1)]
        finally:
            daemon.stop()


async def test_instances_devplug_did_not_make_are_left_alone(short_tmp: Path) -> None:
    """An instance made by someone else before devplug starts: the placements it
    overlaps are not offered and it is never destroyed; devplug's own instance of a
    prepared claim is still known after a restart, and destroyed at unprepare."""
    dirs = NodeDirs(short_tmp)
    host = mig_host(dirs.root / "host", mig=["1g.5gb@6"])
    config = mig_config(dirs.root, host)
    claim(dirs, "mine", DRIVER, {"device": mig_name("2g.10gb", 0)})

    def offered() -> set[str]:
        docs = [json.loads(p.read_text()) for p in dirs.claims.glob("*-0.json")]
        return set(devices_of(docs))

    async with kubelet_for(dirs) as kubelet:
        for round_ in range(2):
            daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log", host.env)
            try:
                await kubelet.wait_for_registration(DRIVER, after=round_)
                names = offered()
                assert mig_name("1g.5gb", 6) not in names
                assert mig_name("7g.40gb", 0) not in names  # it spans slice 6
                assert mig_name("2g.10gb", 0) in names
                if round_ == 0:
                    assert (await prepare(dirs, DRIVER, "mine")) == {"mine": ""}
                    assert instances(host) == [(0, 2), (6, 1)]
                else:
                    await unprepare(dirs, DRIVER, "mine")
                    assert instances(host) == [(6, 1)]
            finally:
                daemon.stop()


def test_the_real_gpu_check_runs_with_the_fake() -> None:
    """tools/mig_partitions_check.py, for hosts with GPUs in MIG mode, works end to end
    on the fake NVML: slices, a partition prepared (its instance made), unprepared."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "tools" / "mig_partitions_check.py"
    result = subprocess.run(
        [sys.executable, str(script), "--fake"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== slices: 2, 25 device(s), 25 MIG partition(s)" in result.stdout
    assert "NVIDIA_VISIBLE_DEVICES=MIG-" in result.stdout
    assert "(the MIG instance destroyed)" in result.stdout
    assert "published 25 device(s)" in result.stdout
