"""Kubernetes 1.37 and 1.38 on the node: the v1 device health service beside v1alpha1,
the standard NUMA attribute, the names and selectors 1.38 accepts, registration sockets
within the AF_UNIX limit."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from devplug.api.drahealth.v1 import api_pb2 as health_v1
from devplug.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug.framework.channel import unix_channel
from tests.dra_helpers import DRIVER, NodeDirs, accelerator_config, serving
from tests.sim_helpers import run

MODELS = {"acc0": "u250", "acc1": "u280"}
HEALTH = [(health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)]


@pytest.fixture
def dirs(short_tmp: Path) -> NodeDirs:
    return NodeDirs(short_tmp)


def test_both_health_versions_stream_the_same_devices_with_the_message(dirs: NodeDirs) -> None:
    config = accelerator_config(dirs, MODELS)

    async def scenario() -> None:
        async with (
            serving(dirs, config) as kubelet,
            unix_channel(dirs.plugins / DRIVER / "dra.sock") as channel,
        ):
            streams = [
                (
                    pb,
                    grpc_pb.DRAResourceHealthStub(channel).NodeWatchResources(
                        pb.NodeWatchResourcesRequest()
                    ),
                )
                for pb, grpc_pb in HEALTH
            ]

            async def read(pb: ModuleType, stream: object) -> dict[str, tuple[str, str]]:
                message = await stream.read()  # type: ignore[attr-defined]
                return {
                    d.device.device_name: (pb.HealthStatus.Name(d.health), d.message)
                    for d in message.devices
                }

            for pb, stream in streams:
                assert await read(pb, stream) == {"acc0": ("HEALTHY", ""), "acc1": ("HEALTHY", "")}
            (dirs.dev / "acc0").unlink()
            seen = [await read(pb, stream) for pb, stream in streams]
            assert seen[0] == seen[1]
            state, message = seen[0]["acc0"]
            assert state == "UNHEALTHY", seen
            assert message, seen
            assert seen[0]["acc1"] == ("HEALTHY", "")
            for _, stream in streams:
                stream.cancel()  # type: ignore[attr-defined]
            # The simulated kubelet, as a 1.37 one, picks v1 from the listed services.
            dra = kubelet.dra
            assert dra is not None
            assert dra.drivers[DRIVER].health_service == "v1.DRAResourceHealth"
            await kubelet.wait_for(
                lambda: dra.device_health_message.get((DRIVER, "node-a", "acc0")) == message,
                what="acc0's message through the v1 stream",
            )

    run(scenario())
