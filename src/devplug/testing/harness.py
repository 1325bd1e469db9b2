"""A kubelet simulator for synchronous tests, with the plugins under test as processes.

`KubeletHarness` runs a `devplug.simulator.Kubelet` on an event loop in a background
thread and offers blocking methods over it, so that plain `def test_...` functions
can start plugins, wait for them, admit pods and read what the kubelet sees. Plugins
run in real processes (their own event loop, signals and sockets, as on a node);
every wait is driven by the simulator's events and the processes' exits.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from devplug.api.constants import ENDPOINT_GRACE_PERIOD_S, REGISTER_DIAL_TIMEOUT_S
from devplug.ground.loopthread import LoopThread
from devplug.testing.pluginprocess import OUTPUT_TAIL, PluginExited, PluginProcess, guarded
from devplug.testing.pluginstart import PluginStarter
from devplug.testing.pods import PodAdmission, is_compact, pod_manifest

if TYPE_CHECKING:
    from devplug.simulator import (
        DeviceStatus,
        Kubelet,
        KubeletEvent,
        NodeStatus,
        PodResult,
        PodSummary,
        ResourceStatus,
    )

__all__ = [
    "DEFAULT_CONTAINER",
    "DEFAULT_TIMEOUT_S",
    "OUTPUT_TAIL",
    "KubeletHarness",
    "PluginExited",
    "PluginProcess",
]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONTAINER = "main"


class KubeletHarness(LoopThread, PluginStarter):
    """A running kubelet simulator in its own temporary folder, driven synchronously.

        with KubeletHarness(topology_policy="single-numa-node", numa_nodes=2) as kubelet:
            kubelet.start_plugin(Widgets())
            pod = kubelet.admit({"example.com/widget": 1})
            assert pod.admitted, pod

    `root` (default: a new temporary folder, removed by `close()`) holds
    `device-plugins/` (the plugin folder), the simulator's state files, and `logs/`
    (one file per plugin process). `timeout` is the default of every wait.
    """

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        topology_policy: str = "none",
        numa_nodes: int | Sequence[int] | None = None,
        grace_period: float = ENDPOINT_GRACE_PERIOD_S,
        dial_timeout: float = REGISTER_DIAL_TIMEOUT_S,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="devplug-"))
        self.plugin_dir = self.root / "device-plugins"
        self.state_dir = self.root
        self.log_dir = self.root / "logs"
        self.topology_policy = topology_policy
        self.numa_nodes = numa_nodes
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        self.timeout = timeout
        self.processes: list[PluginProcess] = []
        self._kubelet: Kubelet | None = None
        self._pod_names = itertools.count(1)
        self._files = itertools.count(1)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> KubeletHarness:
        """Start the simulator (idempotent); returns self."""
        if self._kubelet is not None:
            return self
        from devplug.simulator import Kubelet

        self._start_loop("devplug-kubelet")
        self.log_dir.mkdir(parents=True, exist_ok=True)

        async def start_kubelet() -> Kubelet:
            kubelet = Kubelet(
                self.plugin_dir,
                self.state_dir,
                topology_policy=self.topology_policy,
                numa_nodes=self.numa_nodes,
                grace_period=self.grace_period,
                dial_timeout=self.dial_timeout,
                control_socket=False,
            )
            await kubelet.start()
            return kubelet

        try:
            self._kubelet = self._call(start_kubelet())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def close(self) -> None:
        """Stop every plugin process, the simulator and its thread; remove the folder
        if the harness made it."""
        try:
            if self._loop is not None and self._loop.is_running():
                self._call(self._shutdown())
        finally:
            for process in self.processes:
                process._child.kill_now()
            self._stop_loop()
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    async def _shutdown(self) -> None:
        for process in self.processes:
            process.stopping = True
        await asyncio.gather(*(p._child.stop() for p in self.processes), return_exceptions=True)
        if self._kubelet is not None:
            await self._kubelet.stop()
            self._kubelet = None

    def __enter__(self) -> KubeletHarness:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- running things on the simulator's loop -----------------------------------------

    @property
    def simulator(self) -> Kubelet:
        """The `devplug.simulator.Kubelet` itself; its coroutines run with `run()`."""
        if self._kubelet is None:
            raise RuntimeError("the kubelet harness is not started")
        return self._kubelet

    async def _guarded(self, awaitable: Awaitable[T], what: str) -> T:
        """Await `awaitable`, failing at once if a running plugin process exits."""
        return await guarded(self.processes, awaitable, what)

    # -- waiting ------------------------------------------------------------------------------

    def wait_for_resource(
        self,
        name: str,
        *,
        count: int | None = None,
        capacity: int | None = None,
        timeout: float | None = None,
    ) -> ResourceStatus:
        """Wait until `name` is registered and listed, with `count` allocatable (healthy)
        and `capacity` devices if given; fails at once if a plugin process exits."""
        t = self.timeout if timeout is None else timeout
        return self._call(
            self._guarded(
                self.simulator.wait_for_resource(name, count=count, capacity=capacity, timeout=t),
                f"resource {name}",
            )
        )

    def wait_for_registration(
        self, name: str, *, after: int = 0, timeout: float | None = None
    ) -> int:
        """Wait until `name` has registered more than `after` times; the count."""
        t = self.timeout if timeout is None else timeout
        return self._call(
            self._guarded(
                self.simulator.wait_for_registration(name, after=after, timeout=t),
                f"registration of {name}",
            )
        )

    def wait_for_event(
        self,
        kind: str,
        *,
        resource: str | None = None,
        pod: str | None = None,
        after: int = 0,
        timeout: float | None = None,
    ) -> KubeletEvent:
        """The first event of `kind` after seq `after` (see `devplug.simulator.KubeletEvent`)."""
        t = self.timeout if timeout is None else timeout
        return self._call(
            self._guarded(
                self.simulator.wait_for_event(
                    kind, resource=resource, pod=pod, after=after, timeout=t
                ),
                f"event {kind}",
            )
        )

    def wait_until(
        self, predicate: Callable[[], bool], *, timeout: float | None = None, what: str = ""
    ) -> None:
        """Wait until `predicate()` holds; it is re-checked after every kubelet event and
        every line a process of this harness logs, on the simulator's thread (it may call
        this harness's reading methods)."""
        from devplug.testing.waits import until

        t = self.timeout if timeout is None else timeout
        what = what or getattr(predicate, "__name__", "a condition")
        self._call(self._guarded(until(self.simulator, self.log_dir, predicate, t, what), what))

    # -- what the kubelet sees ------------------------------------------------------------------

    def resource(self, name: str) -> ResourceStatus | None:
        """Capacity, allocatable, allocated, endpoint state and devices of `name`."""
        return self._sync(lambda: self.simulator.resource_status(name))

    def devices(self, name: str) -> list[DeviceStatus]:
        """The devices of `name` as the kubelet sees them (ID, health, NUMA, holders)."""
        status = self.resource(name)
        return list(status.devices) if status is not None else []

    def device_ids(self, name: str, *, healthy: bool | None = None) -> list[str]:
        """Device IDs of `name` in the plugin's order; only healthy (or unhealthy) ones
        when `healthy` is given."""
        return [d.id for d in self.devices(name) if healthy is None or d.healthy == healthy]

    def node(self) -> NodeStatus:
        return self._sync(lambda: self.simulator.node_status())

    def registrations(self, name: str) -> int:
        return self._sync(lambda: self.simulator.registrations(name))

    def events(self) -> list[KubeletEvent]:
        return self._sync(lambda: self.simulator.events)

    @property
    def last_event_seq(self) -> int:
        return self._sync(lambda: self.simulator.last_event_seq)

    def pods(self) -> list[PodSummary]:
        return self._sync(lambda: self.simulator.pods())

    # -- pods -------------------------------------------------------------------------------------

    def apply(
        self, manifests: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> list[PodResult]:
        """Admit the pods of YAML text or manifest dicts, in order (`Kubelet.apply`)."""
        return self._call(self.simulator.apply(manifests))

    def admit(
        self,
        pod: str | Mapping[str, Any],
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> PodAdmission:
        """Admit one pod: YAML text or a manifest dict, or the compact form
        `{"example.com/widget": 2}` (one container, `main`, asking for that). A pod
        without a name is named `pod-1`, `pod-2`..."""
        manifest: dict[str, Any]
        if isinstance(pod, str):
            from devplug.simulator.pods import load_documents

            documents = load_documents(pod)
            if len(documents) != 1 or not isinstance(documents[0], Mapping):
                raise ValueError("admit() takes one pod; apply() takes several")
            manifest = dict(documents[0])
        elif is_compact(pod):
            manifest = pod_manifest("", {DEFAULT_CONTAINER: pod})
        else:
            manifest = dict(pod)
        metadata = dict(manifest.get("metadata") or {})
        if name is not None:
            metadata["name"] = name
        elif not metadata.get("name"):
            metadata["name"] = f"pod-{next(self._pod_names)}"
        if namespace is not None:
            metadata["namespace"] = namespace
        manifest["metadata"] = metadata
        [result] = self.apply(manifest)
        return PodAdmission(result)

    def delete(self, pod: str | PodAdmission, namespace: str = "default") -> bool:
        """Delete a pod (by name or admission) and free its devices; False if unknown."""
        if isinstance(pod, PodAdmission):
            name, namespace = pod.name, pod.namespace
        else:
            name = pod
        return self._call(self.simulator.delete_pod(name, namespace))

    # -- restarts ---------------------------------------------------------------------------------

    def restart(
        self,
        *,
        wait_for: Sequence[str] | None = None,
        timeout: float | None = None,
        kill: bool = False,
    ) -> dict[str, int]:
        """Restart the kubelet as a kubelet restarts (plugin sockets removed, kubelet.sock
        served anew, allocations restored from the checkpoint), then wait until the
        resources of `wait_for` (default: those of the running plugin processes) have
        registered again and listed their devices. Returns their registration counts.
        `kill`: as after SIGKILL, the old kubelet.sock is left behind until the new
        kubelet's start-up wipe."""
        if wait_for is None:
            wait_for = [r for p in self.processes if p.running for r in p.resources]
        resources = list(dict.fromkeys(wait_for))
        t = self.timeout if timeout is None else timeout
        kubelet = self.simulator

        async def restart() -> dict[str, int]:
            before = {r: kubelet.registrations(r) for r in resources}
            await kubelet.restart(kill=kill)
            for r in resources:
                await self._guarded(
                    kubelet.wait_for_registration(r, after=before[r], timeout=t),
                    f"registration of {r} after the restart",
                )
                await self._guarded(kubelet.wait_for_resource(r, timeout=t), f"resource {r}")
            return {r: kubelet.registrations(r) for r in resources}

        return self._call(restart())
