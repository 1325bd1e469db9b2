"""The NVIDIA source's parts: config checks, the NVML interface over the fake driver and
its errors, topology choice, calls with timeouts."""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest

from devplug.fakes import nvml as fakenvml
from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid, mig_layout
from devplug.sources import ConfigError, parse_config
from devplug.sources.nvidia import blocking
from devplug.sources.nvidia import nvml as nvml_module
from devplug.sources.nvidia.nvml import Nvml, NvmlView, bus_id
from devplug.sources.nvidia.topology import Links, best_gpus, packed_gpus


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    return str(caught.value)


def test_config_defaults_and_errors() -> None:
    [resource] = parse_config("resources:\n- nvidia: {}\n").resources
    assert resource.name == "nvidia.com/gpu"
    assert resource.nvidia is not None
    assert resource.nvidia.ignored_xids == []  # added to NVIDIA's defaults
    assert resource.nvidia.device_list_strategy == ["envvar"]
    assert error("resources:\n- nvidia: {replicas: 0}\n") == (
        "c.yaml: resources[0].nvidia.replicas: expected an integer from 1 to 256, got 0"
    )
    assert error("resources:\n- nvidia: {migStrategy: some}\n").startswith(
        "c.yaml: resources[0].nvidia.migStrategy: "
    )
    assert error("resources:\n- nvidia: {gpus: 2}\n") == (
        "c.yaml: resources[0].nvidia.gpus: unknown key"
    )
    assert "channelIDs must be [] or [0]" in error("resources:\n- nvidia: {imexChannelIDs: [1]}\n")
    assert error("resources:\n- nvidia: {}\n  count: 2\n") == (
        "c.yaml: resources[0].count: not used with 'nvidia': set nvidia.replicas to share GPUs"
    )
    assert error("resources:\n- nvidia: {}\n  virtual: 2\n").startswith("c.yaml: resources[0]: ")
    assert error("resources:\n- nvidia: {recoverySeconds: 0}\n") == (
        "c.yaml: resources[0].nvidia.recoverySeconds: expected a number > 0, got 0.0"
    )
    assert "outside the resource's domain" in error(
        "resources:\n- nvidia: {resourceNames: {NVIDIA L4: example.com/l4}}\n"
    )
    assert (
        error("resources:\n- virtual: 1\n") == "c.yaml: resources[0].name: required key is missing"
    )


def loaded(host: FakeGpuHost, monkeypatch: pytest.MonkeyPatch) -> FakeGpuHost:
    """`host`, which `Nvml()` loads in this test."""
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    return host


def view_of(folder: Path, description: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> NvmlView:
    loaded(FakeGpuHost(folder, description), monkeypatch)
    return read_view()


def read_view() -> NvmlView:
    """What NVML shows now, NVML stopped again (in-process state left as it was)."""
    nvml = Nvml()
    nvml.start()
    try:
        return nvml.read()
    finally:
        nvml.stop()


@pytest.fixture
def fake(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpuHost:
    return loaded(FakeGpuHost(short_tmp, mig_layout()), monkeypatch)


def test_nvml_interface_over_the_fake(fake: FakeGpuHost) -> None:
    nvml = Nvml()
    assert nvml.lib is fakenvml
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.read()
    nvml.start()
    view = nvml.read()
    assert [len(g.migs) for g in view.gpus] == [7, 3, 0]
    assert [m.profile for m in view.gpus[1].migs] == ["3g.20gb", "2g.10gb", "2g.10gb"]
    assert [(g.mig_capable, g.mig_enabled) for g in view.gpus][2] == (True, False)
    assert view.gpus[0].compute_capability == (8, 0)
    assert view.cuda_version == "12.4"
    events, unwatched = nvml.watch_events()
    assert unwatched == []
    assert nvml.wait_event(events, 1) is None  # NVMLError_Timeout: nothing happened
    fake.inject_xid(1, 48)
    event = nvml.wait_event(events, 1000)
    assert event is not None
    assert (event.index, event.xid) == (1, 48)
    fake.set_lost(2, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.probe(2)
    handle = fakenvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_NotFound):  # an empty MIG slot
        fakenvml.nvmlDeviceGetMigDeviceHandleByIndex(fakenvml.nvmlDeviceGetHandleByIndex(1), 5)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no NVLink on this host
        fakenvml.nvmlDeviceGetNvLinkState(handle, 0)
    memory = fakenvml.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == 40 * 1024**3
    nvml.free(events)
    nvml.stop()


def test_the_fake_has_pynvmls_signatures_and_every_function_devplug_calls() -> None:
    """Keyword callers and new calls in nvml.py work the same on the real binding."""
    for name, fake in vars(fakenvml).items():
        if name.startswith("nvml") and inspect.isfunction(fake):
            real = inspect.signature(getattr(pynvml, name))
            mine = inspect.signature(fake)
            assert [(p.name, p.default) for p in mine.parameters.values()] == [
                (p.name, p.default) for p in real.parameters.values()
            ], name
    source = Path(nvml_module.__file__).read_text()
    for name in set(re.findall(r"\blib\.(\w+)", source)):
        assert hasattr(fakenvml, name), f"the fake lacks {name}"
        assert name in vars(pynvml), f"pynvml has no {name}"
    for name in ("NVMLError_NotFound", "NVMLError_GpuIsLost", "NVMLError_Timeout"):
        assert getattr(fakenvml, name) is getattr(pynvml, name)


def test_nvlinks_and_common_ancestors(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view = view_of(short_tmp, eight_gpus(), monkeypatch)
    assert view.nvlinks == {(0, 3): 4, (1, 2): 4, (4, 7): 4, (5, 6): 4}
    assert (view.ancestors[(0, 1)], view.ancestors[(0, 2)], view.ancestors[(0, 4)]) == (10, 40, 50)
    assert view.gpus[7].uuid == gpu_uuid(7)
    assert bus_id("00000000:1B:00.0") == "0000:1b:00.0"


def test_nvlinks_through_nvswitches(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Links whose far end is no GPU go to NVSwitches: every pair of GPUs on the
    switches is linked by as many links as the less-linked of the two has."""
    description = eight_gpus()
    for index, entry in enumerate(description["gpus"][:3]):
        entry["nvlinks"] = ["00000000:F0:00.0"] * (2 + index)  # NVSwitch ports
    for entry in description["gpus"][3:]:
        entry["nvlinks"] = []
    view = view_of(short_tmp, description, monkeypatch)
    assert view.nvlinks == {(0, 1): 2, (0, 2): 2, (1, 2): 3}


def test_topology_choice() -> None:
    numa = {i: i // 4 for i in range(8)}
    ancestors = {
        (i, j): 10 if i // 2 == j // 2 else 40 if i // 4 == j // 4 else 50
        for i in range(8)
        for j in range(i + 1, 8)
    }
    links = Links({(0, 3): 4, (1, 2): 4, (4, 7): 2, (5, 6): 4}, ancestors, numa)
    assert best_gpus(range(8), [], 2, links) == [0, 3]
    assert best_gpus([1, 2, 4, 5, 6, 7], [], 2, links) == [1, 2]  # ties: lowest indices
    assert best_gpus([2, 4, 5, 6, 7], [4], 2, links) == [4, 7]  # must-include GPU 4
    assert best_gpus([0, 1, 2, 3], [], 4, links) == [0, 1, 2, 3]
    # Without NVLink: the PCIe switch pair, then the NUMA node.
    plain = Links({}, ancestors, numa)
    assert best_gpus([1, 2, 3, 4], [], 2, plain) == [2, 3]
    assert best_gpus([1, 3, 4], [], 2, plain) == [1, 3]
    # The answer does not depend on the order candidates come in.
    order = list(range(8))
    random.Random(7).shuffle(order)
    assert best_gpus(order, [], 4, links) == best_gpus(range(8), [], 4, links)
    # Many GPUs: the greedy path still takes NVLink pairs.
    many = Links({(2 * i, 2 * i + 1): 2 for i in range(16)})
    chosen = best_gpus(range(32), [], 8, many)
    assert len(chosen) == 8
    assert many.score(chosen)[0] == 8  # four pairs of two links


def test_packed_choice() -> None:
    numa = {i: i // 4 for i in range(8)}
    links = Links({(0, 3): 4, (1, 2): 4, (4, 7): 4, (5, 6): 4}, {}, numa)
    whole = dict.fromkeys(range(8), 4)
    assert packed_gpus(whole, [], 3, links) == [0]  # one GPU holds them
    assert packed_gpus(whole, [], 6, links) == [0, 3]  # two: an NVLink pair
    assert packed_gpus(whole, [5], 6, links) == [5, 6]  # with the must-include GPU
    # The busiest GPU first; spanning, the busiest linked pair (GPU 1 and 2 hold 5).
    busy = whole | {1: 1, 2: 4, 6: 2}
    assert packed_gpus(busy, [], 1, links) == [1]
    assert packed_gpus(busy, [], 5, links) == [1, 2]
    # As few GPUs as possible, even if a busier GPU would take part of the request.
    assert packed_gpus(whole | {1: 1}, [], 4, links) == [0]
    assert packed_gpus(whole, [], 40, links) == list(range(8))  # more than there is


async def test_blocking_call_times_out_without_blocking_the_loop() -> None:
    release = threading.Event()

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    with pytest.raises(blocking.Hung):
        await blocking.call(release.wait, 0.05, "a hung call")
    assert ticks > 10  # the loop kept running meanwhile
    assert await blocking.call(lambda: 42, 1, "a call") == 42
    with pytest.raises(ZeroDivisionError):
        await blocking.call(lambda: 1 // 0, 1, "a failing call")
    ticker.cancel()
    release.set()
    with pytest.raises(blocking.Hung):
        blocking.call_sync(threading.Event().wait, 0.05, "a hung call")


def test_docs_examples_are_valid() -> None:

    text = (Path(__file__).resolve().parents[2] / "docs" / "nvidia.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert blocks
    for block in (b for b in blocks if not b.startswith("apiVersion:")):  # manifests
        [resource] = parse_config(block, "docs/nvidia.md").resources
        assert resource.nvidia is not None


def test_xid_policy() -> None:
    """The catalog's immediate resolution decides; ignoredXids adds to NVIDIA's defaults
    and enabledXids takes out, as DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS do."""
    from devplug.sources.nvidia.xids import ignored_xids, needs_reset, resolution, xid_action

    ignored = ignored_xids([999])
    assert {13, 31, 43, 45, 68, 109, 999} == ignored
    assert xid_action(13, ignored) == "ignore"
    assert xid_action(13, ignored_xids([], [13])) == "transient"
    assert [xid_action(x) for x in (94, 63, 8, 92)] == ["transient"] * 4
    for xid in (48, 64, 74, 79, 95, 119, 120, 145, 151):
        assert xid_action(xid) == "reset", xid
    assert xid_action(5000) == "reset"  # not in the catalog: as NVIDIA's plugin treats it
    assert needs_reset(109)  # RESET_GPU in the catalog,
    assert xid_action(109) == "ignore"  # but ignored by default
    assert resolution(79) == "RESTART_BM"
    assert error("resources:\n- nvidia: {enabledXids: [-1]}\n") == (
        "c.yaml: resources[0].nvidia.enabledXids: expected Xid numbers >= 0, got -1"
    )
    assert error("resources:\n- nvidia: {resetCheck: {checks: []}}\n") == (
        "c.yaml: resources[0].nvidia.resetCheck.checks: expected at least one check"
    )
