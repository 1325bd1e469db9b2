"""A kubelet simulator for synchronous tests, with the plugins under test as processes.

`KubeletHarness` runs a `devplug.simulator.Kubelet` on an event loop in a background
thread and offers blocking methods over it, so that plain `def test_...` functions
can start plugins, wait for them, admit pods and read what the kubelet sees. Plugins
run in real processes (their own event loop, signals and sockets, as on a node);
every wait is driven by the simulator's events and the processes' exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

import yaml

from devplug.api.constants import ENDPOINT_GRACE_PERIOD_S, REGISTER_DIAL_TIMEOUT_S
from devplug.ground.process import STOP_TIMEOUT_S, ChildProcess
from devplug.testing.pods import PodAdmission, is_compact, pod_manifest

if TYPE_CHECKING:
    from devplug.framework.plugin import Plugin
    from devplug.simulator import (
        DeviceStatus,
        Kubelet,
        KubeletEvent,
        NodeStatus,
        PodResult,
        PodSummary,
        ResourceStatus,
    )

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONTAINER = "main"
OUTPUT_TAIL = 4000


class PluginExited(RuntimeError):
    """A plugin process ended while the harness was waiting for something."""


class PluginProcess:
    """A plugin process started by a harness; stopped with it at the latest."""

    def __init__(
        self,
        harness: KubeletHarness,
        child: ChildProcess,
        name: str,
        log_path: Path,
        resources: Sequence[str],
    ) -> None:
        self._harness = harness
        self._child = child
        self.name = name
        self.log_path = log_path
        # The resources it serves, when known (plugin objects, references, configs).
        self.resources = tuple(resources)
        self.stopping = False

    @property
    def args(self) -> list[str]:
        return self._child.args

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._harness._sync(lambda: self._child.returncode)

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def output(self) -> str:
        """Its stdout and stderr (logs) so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send `sig` (SIGKILL after `timeout` seconds) and return the exit status."""
        self.stopping = True
        return self._harness._call(self._child.stop(sig, timeout))

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end by itself; its exit status."""
        self.stopping = True
        timeout = self._harness.timeout if timeout is None else timeout
        return self._harness._call(self._child.wait(timeout))

    def _exit_future(self) -> asyncio.Future[int]:
        return self._child.exited

    def __repr__(self) -> str:
        return f"<PluginProcess {self.name} pid {self.pid}>"


class KubeletHarness:
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._kubelet: Kubelet | None = None
        self._pod_names = itertools.count(1)
        self._files = itertools.count(1)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> KubeletHarness:
        """Start the simulator (idempotent); returns self."""
        if self._kubelet is not None:
            return self
        from devplug.simulator import Kubelet

        loop = asyncio.new_event_loop()
        started: Future[None] = Future()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set_result, None)
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="devplug-kubelet", daemon=True)
        self._loop = loop
        self._thread.start()
        started.result()
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

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():

            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(STOP_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None

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

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run a coroutine on the simulator's event loop and return its result."""

        async def wrap() -> T:
            return await awaitable

        return self._call(wrap())

    def _in_loop(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the kubelet harness is not started")
        if self._in_loop():
            coro.close()
            raise RuntimeError("blocking harness calls cannot be made from the simulator's loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _sync(self, fn: Callable[[], T]) -> T:
        """`fn()` on the loop thread (where the simulator's state lives)."""
        if self._in_loop() or self._loop is None:
            return fn()

        async def go() -> T:
            return fn()

        return self._call(go())

    async def _guarded(self, awaitable: Awaitable[T], what: str) -> T:
        """Await `awaitable`, failing at once if a running plugin process exits."""
        main = asyncio.ensure_future(awaitable)
        watched = {p._exit_future(): p for p in self.processes if not p.stopping and p.running}
        waiting: set[asyncio.Future[Any]] = {main, *watched}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            main.cancel()
            raise
        if main.done():
            return main.result()
        main.cancel()
        with contextlib.suppress(BaseException):
            await main
        process = next(p for f, p in watched.items() if f.done())
        output = process.output[-OUTPUT_TAIL:]
        raise PluginExited(
            f"plugin process {process.name} exited with status {process._child.returncode} "
            f"while waiting for {what}; its output:\n{output}"
        )

    # -- plugins ------------------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(os.environ)
        # The child imports what this process can: the test's own modules included.
        paths = [p or os.getcwd() for p in sys.path]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PLUGIN_DIR"] = str(self.plugin_dir)
        env["DEVPLUG_PLUGIN_DIR"] = str(self.plugin_dir)
        env.update(extra or {})
        return env

    def _spawn(
        self,
        args: Sequence[str],
        name: str,
        resources: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | str | None,
    ) -> PluginProcess:
        index = next(self._files)
        log_path = self.log_dir / f"{index}-{_safe(name)}.log"

        async def spawn(log: IO[bytes]) -> ChildProcess:
            return ChildProcess(
                args, env=self._env(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )

        with open(log_path, "wb") as log:
            child = self._call(spawn(log))
        process = PluginProcess(self, child, name, log_path, resources)
        self.processes.append(process)
        return process

    def _after_start(
        self, process: PluginProcess, wait_for: Sequence[str], timeout: float | None
    ) -> PluginProcess:
        for resource in wait_for:
            self.wait_for_resource(resource, timeout=timeout)
        return process

    def start_plugin(
        self,
        *plugins: Plugin | str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Serve plugins in a new process (`devplug.run`) against this kubelet.

        Each of `plugins` is a `Plugin` object (sent to the process by pickle: its class
        must be importable there, i.e. defined at the top level of a module), or a
        reference `"module:attribute"` / `"path/to/file.py:attribute"` to a Plugin, a
        Plugin subclass or a function returning plugins, resolved in the new process.
        With `wait`, returns once every resource is registered and its devices listed.
        """
        from devplug.framework.plugin import Plugin
        from devplug.testing.runner import dump_plugins, resolve

        if not plugins:
            raise ValueError("start_plugin needs at least one plugin")
        objects = [p for p in plugins if isinstance(p, Plugin)]
        references = [p for p in plugins if not isinstance(p, Plugin)]
        specs: list[str] = []
        resources = [p.resource_name for p in objects]
        if objects:
            path = self.root / f"plugins-{next(self._files)}.pickle"
            path.write_bytes(dump_plugins(objects))
            specs.append(f"@{path}")
        for reference in references:
            if not isinstance(reference, str):
                raise TypeError(f"expected a Plugin or a 'module:attribute' string: {reference!r}")
            # Resolved here too, for the resource names to wait for.
            resources += [p.resource_name for p in resolve(reference)]
            specs.append(reference)
        name = ",".join(resources) or "plugins"
        args = [
            sys.executable,
            "-m",
            "devplug.testing.runner",
            "--plugin-dir",
            str(self.plugin_dir),
            *specs,
        ]
        process = self._spawn(args, name, resources, env, cwd)
        return self._after_start(process, resources if wait else (), timeout)

    def start_script(
        self,
        script: Path | str,
        *args: str,
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Run a plugin program, `python SCRIPT ARGS`, as it runs on a node. It finds the
        plugin folder in `$PLUGIN_DIR` (also `$DEVPLUG_PLUGIN_DIR`). Returns once the
        resources of `wait_for` are registered and listed."""
        command = [sys.executable, str(script), *args]
        return self._start_program(command, Path(script).name, wait_for, env, cwd, timeout)

    def start_module(
        self,
        module: str,
        *args: str,
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """`python -m MODULE ARGS`, otherwise as `start_script`."""
        command = [sys.executable, "-m", module, *args]
        return self._start_program(command, module, wait_for, env, cwd, timeout)

    def start_command(
        self,
        command: Sequence[str],
        *,
        name: str = "",
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Run any command that serves plugins in this kubelet's folder (a plugin in a
        container's root file system, a binary); otherwise as `start_script`."""
        label = name or Path(command[0]).name
        return self._start_program(list(command), label, wait_for, env, cwd, timeout)

    def _start_program(
        self,
        command: list[str],
        name: str,
        wait_for: str | Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | str | None,
        timeout: float | None,
    ) -> PluginProcess:
        resources = [wait_for] if isinstance(wait_for, str) else list(wait_for)
        process = self._spawn(command, name, resources, env, cwd)
        return self._after_start(process, resources, timeout)

    def start_serve(
        self,
        config: Path | str | Mapping[str, Any],
        *args: str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """`devplug serve --config CONFIG --plugin-dir <this kubelet's>`: `config` is a
        file, YAML text (a string with a newline) or a mapping. With `wait`, the config is
        checked first (ConfigError) and the call returns once all its resources are
        registered and listed."""
        if isinstance(config, Mapping) or (isinstance(config, str) and "\n" in config):
            text = config if isinstance(config, str) else yaml.safe_dump(dict(config))
            path = self.root / f"config-{next(self._files)}.yaml"
            path.write_text(text)
        else:
            path = Path(config)
        resources: list[str] = []
        if wait:
            from devplug.sources import load_config, resource_names

            resources = resource_names(load_config(path))
        command = [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "serve",
            "--config",
            str(path),
            "--plugin-dir",
            str(self.plugin_dir),
            *args,
        ]
        process = self._spawn(command, f"serve {path.name}", resources, env, None)
        return self._after_start(process, resources, timeout)

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
        """Wait until `predicate()` holds; it is re-checked after every kubelet event, on
        the simulator's thread (it may call this harness's reading methods)."""
        t = self.timeout if timeout is None else timeout
        what = what or getattr(predicate, "__name__", "a condition")
        self._call(self._guarded(self.simulator.wait_for(predicate, t, what), what))

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

    # -- reports ------------------------------------------------------------------------------

    def plugin_outputs(self) -> str:
        """Every plugin process's command line, exit status and output, for reports."""
        parts = []
        for process in self.processes:
            code = process._child.returncode
            state = "running" if code is None else f"exited with status {code}"
            parts.append(
                f"--- {process.name} (pid {process.pid}, {state}): {' '.join(process.args)}\n"
                + process.output[-OUTPUT_TAIL:]
            )
        return "\n".join(parts)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
