"""A kubelet device-manager simulator: run device plugins against it, no cluster needed.

The library comes first (`Kubelet`), the `devplug kubelet`, `devplug pods`,
`devplug node` and `devplug kubelet-restart` commands drive it:

    from devplug.simulator import Kubelet

    async with Kubelet(plugin_dir, state_dir, topology_policy="restricted") as kubelet:
        await kubelet.wait_for_resource("example.com/foo", count=2)
        [pod] = await kubelet.apply(POD_YAML)
        assert pod.admitted, pod.message
"""

from devplug.simulator.checkpoint import CheckpointError
from devplug.simulator.control import ControlClient, ControlError
from devplug.simulator.events import KubeletEvent
from devplug.simulator.kubelet import Kubelet
from devplug.simulator.pods import ManifestError
from devplug.simulator.results import (
    REASON_ALREADY_EXISTS,
    REASON_INVALID,
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    ContainerResult,
    DeviceStatus,
    NodeStatus,
    PodResult,
    PodSummary,
    ResourceStatus,
    RuntimeOptions,
)
from devplug.simulator.topology import POLICIES

__all__ = [
    "POLICIES",
    "REASON_ALREADY_EXISTS",
    "REASON_INVALID",
    "REASON_TOPOLOGY_AFFINITY",
    "REASON_UNEXPECTED_ADMISSION",
    "CheckpointError",
    "ContainerResult",
    "ControlClient",
    "ControlError",
    "DeviceStatus",
    "Kubelet",
    "KubeletEvent",
    "ManifestError",
    "NodeStatus",
    "PodResult",
    "PodSummary",
    "ResourceStatus",
    "RuntimeOptions",
]
