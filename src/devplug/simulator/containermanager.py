"""The kubelet's container manager: the device manager (with the topology manager it
consults and the Registration server plugins call) and the DRA manager, started and
stopped together as the kubelet's `cm` package starts them.

At start the device manager restores the checkpoint; the plugin folder is cleaned
before Registration is served; DRA starts last and stops first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.unixserver import UnixServer
from devplug.simulator.manager import Allocation, DeviceInfo, DeviceManager, Histogram
from devplug.simulator.plugindir import cleanup_plugin_dir, kept_aside
from devplug.simulator.registration import Emit, Registrar, RegistrationServicer

if TYPE_CHECKING:
    from devplug.framework.dra.claims import ClaimSource
    from devplug.simulator.dra import DraManager, NodeSlices


class ContainerManager:
    """What the node's devices are managed by, between one start and its stop.

    `emit(kind, resource, detail)` records the managers' events; `registrar` handles
    Register and counts registrations (DRA drivers' too).
    """

    def __init__(
        self,
        *,
        plugin_dir: Path,
        state_dir: Path,
        checkpoint_path: Path,
        registration_socket: Path,
        topology_policy: str,
        numa_nodes: Sequence[int] | None,
        grace_period: float,
        dial_timeout: float,
        emit: Emit,
        dra_registry_dir: Path | None,
        claims: ClaimSource | None,
        node_slices: NodeSlices | None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.state_dir = state_dir
        self.checkpoint_path = checkpoint_path
        self.registration_socket = registration_socket
        self.topology_policy = topology_policy
        self.numa_nodes = numa_nodes
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        self._emit = emit
        self.dra_registry_dir = dra_registry_dir
        self._claims = claims
        # With an API server: the node's ResourceSlices, wiped at start as the kubelet does.
        self._node_slices = node_slices
        self.registrar = Registrar(
            plugin_dir,
            lambda: self.devices.register if self.devices is not None else None,
            emit,
        )
        # Allocate durations per resource, kept across restarts.
        self.alloc_durations: dict[str, Histogram] = {}
        self.devices: DeviceManager | None = None
        self.dra: DraManager | None = None
        self._registration_server: UnixServer | None = None

    def restore(self, known_pods: Iterable[str]) -> tuple[DeviceManager, str | None]:
        """A new device manager with the allocations of `known_pods` from the
        checkpoint; and why the checkpoint could not be used, if it could not (an
        unusable one is kept aside)."""
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        manager = DeviceManager(
            self.checkpoint_path,
            policy=self.topology_policy,
            numa_nodes=self.numa_nodes,
            grace_period=self.grace_period,
            dial_timeout=self.dial_timeout,
            on_event=self._emit,
            alloc_durations=self.alloc_durations,
        )
        problem = manager.restore(known_pods)
        if problem and self.checkpoint_path.is_file():
            problem += f"; kept as {kept_aside(self.checkpoint_path)}"
        self.devices = manager
        return manager, problem

    async def serve_registration(self, keep: set[Path]) -> None:
        """Clean the plugin folder (`keep` aside) and serve Registration."""
        registered = self.registrar.plugin_sockets
        cleanup_plugin_dir(self.plugin_dir, keep, registered)
        registered.clear()
        self._registration_server = UnixServer(
            self.registration_socket,
            lambda server: pb_grpc.add_RegistrationServicer_to_server(
                RegistrationServicer(self.registrar.register), server
            ),
        )
        await self._registration_server.start()

    async def start_dra(self) -> None:
        """Start the DRA manager, when the node has DRA."""
        if self.dra_registry_dir is None or self._claims is None:
            return
        from devplug.simulator.dra import DraManager

        self.dra = DraManager(
            self.dra_registry_dir,
            self.state_dir,
            self._claims,
            on_event=self._dra_event,
            slices=self._node_slices,
        )
        await self.dra.start()

    def _dra_event(self, kind: str, driver: str, detail: str) -> None:
        from devplug.simulator.dra import DRIVER_REGISTERED

        if kind == DRIVER_REGISTERED:
            self.registrar.done[driver] += 1
        self._emit(kind, driver, detail)

    # -- the PodResources API's devices ---------------------------------------------------

    def allocations(self, pod_uid: str, container: str) -> Mapping[str, Allocation]:
        manager = self.devices
        return manager.container_devices(pod_uid, container) if manager is not None else {}

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceInfo]]:
        manager = self.devices
        if manager is None:
            return {}
        return {
            name: [d for d in state.devices.values() if d.id in state.healthy]
            for name, state in manager.resources.items()
        }

    async def stop(self) -> None:
        """Stop DRA, Registration and the device manager's plugin connections (the
        device manager stays, for the status of a stopped node)."""
        if self.dra is not None:
            await self.dra.stop()
            self.dra = None
        if self._registration_server is not None:
            await self._registration_server.stop(grace=0)
            self._registration_server = None
        if self.devices is not None:
            await self.devices.close()
