"""The GPU source's Xid policy (NVIDIA's catalog) through DRA, on the fake NVML: it
decides which Xids taint a GPU in the slice, with the configured effect, and for how
long: an ignored Xid (13) nothing; one needing a reset (79) a taint that stays; a
transient one (94) a taint gone after the quiet time. The taint's value and the
kubelet's health stream both say which Xid.

One node serves the whole file (module-scoped fixtures, in story order); each test
checks one behaviour of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from devplug.fakes.nvml import FakeGpuHost, gpu, gpu_uuid
from devplug.simulator import Kubelet
from tests.dra_cluster_helpers import node_serving, slice_devices, slice_where
from tests.dra_helpers import NODE, NodeDirs

pytestmark = pytest.mark.asyncio(loop_scope="module")

GPU_DRIVER = "gpu.devplug.io"
UNHEALTHY = "devplug.io/unhealthy"


def by_uuid(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["attributes"]["uuid"]["string"]: d for d in slice_devices(obj).values()}


def taints(obj: dict[str, Any]) -> dict[int, list[tuple[str, str, str]]]:
    """The taints of each of the four GPUs (by index) in the slice `obj`."""
    found = {}
    for index in range(4):
        listed = by_uuid(obj)[gpu_uuid(index)].get("taints") or []
        found[index] = [(t["key"], t.get("value", ""), t["effect"]) for t in listed]
    return found


async def ours(api: Any, test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The slice of the four GPUs once `test` accepts it."""
    return await slice_where(
        api,
        lambda o: o["spec"]["driver"] == GPU_DRIVER and len(slice_devices(o)) == 4 and test(o),
    )


@pytest.fixture(scope="module")
def host(module_dirs: NodeDirs) -> FakeGpuHost:
    """Four A10s on the fake NVML."""
    gpus = [gpu(i, name="NVIDIA A10", memory_gib=24, cc=(8, 6), numa=0) for i in range(4)]
    return FakeGpuHost(module_dirs.root / "gpus", {"driver": {"loaded": True}, "gpus": gpus})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, api: Any, node: str, module_dirs: NodeDirs, host: FakeGpuHost
) -> AsyncIterator[Kubelet]:
    """The node serving the GPUs through DRA (taints NoExecute, a 1 s quiet time), its
    slice published with no taint."""
    import yaml

    nvidia = {"hostRoot": host.host_root, "recoverySeconds": 1, "probeSeconds": 0.05}
    entry = {
        "nvidia": nvidia,
        "mode": "dra",
        "dra": {"driver": GPU_DRIVER, "taintEffect": "NoExecute"},
    }
    config = module_dirs.root / "gpus.yaml"
    config.write_text(yaml.safe_dump({"resources": [entry]}))
    async with node_serving(module_dirs, api, kubeconfig, config, GPU_DRIVER, host.env) as kubelet:
        await ours(api, lambda o: not any(taints(o).values()))
        yield kubelet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tainted(serving: Kubelet, host: FakeGpuHost, api: Any) -> dict[str, Any]:
    """The slice once Xids 13, 79 and 94 hit GPUs 0, 1 and 2, in that order (the
    ignored one first: it changes nothing), and the last two are tainted."""
    host.inject_xid(0, 13)
    host.inject_xid(1, 79)
    host.inject_xid(2, 94)
    return await ours(api, lambda o: bool(taints(o)[1] and taints(o)[2]))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def reset_health(serving: Kubelet, tainted: dict[str, Any]) -> str:
    """The message of the kubelet's health stream for GPU 1, once it is Unhealthy."""
    dra = serving.dra
    assert dra is not None
    key = (GPU_DRIVER, NODE, by_uuid(tainted)[gpu_uuid(1)]["name"])
    await serving.wait_for(
        lambda: dra.device_health.get(key) == "Unhealthy",
        what="GPU 1 unhealthy in the health stream",
    )
    return dra.device_health_message[key]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def recovered(reset_health: str, api: Any) -> dict[str, Any]:
    """The slice once the transient Xid's taint went."""
    return await ours(api, lambda o: not taints(o)[2])


async def test_an_ignored_xid_taints_nothing(tainted: dict[str, Any]) -> None:
    found = taints(tainted)
    assert (found[0], found[3]) == ([], [])  # GPU 3 had no Xid at all


async def test_an_xid_needing_a_reset_taints_its_gpu_saying_so(tainted: dict[str, Any]) -> None:
    assert taints(tainted)[1] == [(UNHEALTHY, "Xid-79-needs-a-reset", "NoExecute")]


async def test_a_transient_xid_taints_its_gpu_with_the_configured_effect(
    tainted: dict[str, Any],
) -> None:
    assert taints(tainted)[2] == [(UNHEALTHY, "Xid-94", "NoExecute")]


async def test_the_kubelets_health_stream_says_which_xid(reset_health: str) -> None:
    assert reset_health == "Xid 79, needs a reset"


async def test_a_transient_xids_taint_goes_after_the_quiet_time(
    recovered: dict[str, Any],
) -> None:
    assert taints(recovered)[2] == []


async def test_the_taint_of_an_xid_needing_a_reset_stays(recovered: dict[str, Any]) -> None:
    assert [i for i, t in taints(recovered).items() if t] == [1]
