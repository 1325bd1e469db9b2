"""The simulated kubelet's pods from a real API server (the throwaway control plane): a
pod bound to its node is run, and one deleted while the watch was away, its version then
refused as too old (410), is deleted from the node by the list made again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from devplug.apiserver.kubeconfig import load
from devplug.simulator import Kubelet
from devplug.simulator.apipods import ApiPodFollower
from devplug.simulator.events import POD_DELETED
from tests.controlplane.test_extender_cache import Hooks

WAIT_S = 30.0


async def test_a_pod_deleted_while_the_watch_was_away_leaves_the_node_after_a_new_list(
    kubeconfig: str, short_tmp: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    node, namespace = f"pods-{tag}", f"pods-{tag}"
    pods = f"/api/v1/namespaces/{namespace}/pods"

    class Away(Hooks):
        """The first watch ended at once; the pod deleted before the second, which is
        refused as too old."""

        async def before(self, watch: int) -> bool:
            if watch == 2:
                await self.call("DELETE", f"{pods}/gone", {"gracePeriodSeconds": 0})
            return watch != 2

        async def watch(
            self, path: str, params: Mapping[str, str], timeout: float
        ) -> AsyncIterator[bytes]:
            async for line in super().watch(path, params, 1 if self.watches == 0 else timeout):
                yield line

    async with Away(load(kubeconfig)) as api:
        await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        spec = {"nodeName": node, "containers": [{"name": "c", "image": "none"}]}
        await api.call("POST", pods, {"metadata": {"name": "gone"}, "spec": spec})
        async with Kubelet(short_tmp / "dp", short_tmp / "state", control_socket=False) as kubelet:
            follower = ApiPodFollower(kubelet, api, node)
            task = asyncio.create_task(follower.run())
            try:
                await kubelet.wait_for(lambda: kubelet.pod("gone", namespace) is not None, WAIT_S)
                await kubelet.wait_for_event(POD_DELETED, pod=f"{namespace}/gone", timeout=WAIT_S)
                assert follower.applied == set()
                assert api.watches >= 2
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
