"""The demo's scenario: a simulated kubelet, real plugin processes, sample pods.

`run_demo()` makes a work folder, serves the kubelet simulator in this process, starts
`devplug serve` (the packaged default config) as a child process and walks through
registration, node capacity, pod admission, a pod deletion and a kubelet restart.
Every wait is on an event of the simulator (a registration, a device list); nothing
sleeps. What happens is reported as events to a view (`devplug.demo.view`).

The plugin process and the work folder are removed on every way out: the end of the
story, a failure, SIGINT, SIGTERM or SIGHUP. A plugin process that dies makes the
demo fail (exit 1) with its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from devplug.config.ids import physical_id
from devplug.demo.plugin import (
    STDERR_TAIL,
    STOP_TIMEOUT_S,
    DemoFailed,
    PluginDied,
    PluginProcess,
    serve_command,
)
from devplug.demo.sample import STORY_ANNOTATION, describe, sample_pods, stories
from devplug.demo.view import View, make_view

if TYPE_CHECKING:
    from devplug.simulator import Kubelet, KubeletEvent, ResourceStatus

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "STDERR_TAIL",
    "STOP_TIMEOUT_S",
    "STORY_ANNOTATION",
    "Demo",
    "DemoFailed",
    "PluginDied",
    "PluginProcess",
    "describe",
    "run_demo",
    "sample_pods",
    "serve_command",
    "stories",
]

log = logging.getLogger("devplug.demo")

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1

SHARED = "devplug.io/shared"
DELETED_POD = "fits"
NAMESPACE = "default"

# How long the plugin process may take to register (Python start included), and to
# register again after the kubelet restart. Generous: the waits end on the event.
FIRST_REGISTRATION_TIMEOUT_S = 30.0
REREGISTRATION_TIMEOUT_S = 15.0
# The longest socket path in the work folder is WORKDIR/device-plugins/<plugin socket>
# (about 47 bytes after WORKDIR for the default config); Unix sockets allow 107.
MAX_WORKDIR_LENGTH = 56


class Demo:
    """The story, step by step, reported to a view."""

    def __init__(
        self,
        view: View,
        workdir: Path,
        plugin_command: Sequence[str] | None,
        log_level: str,
        began: float,
    ) -> None:
        from devplug.sources import load_default_config

        self.view = view
        self.workdir = workdir
        self.plugin_dir = workdir / "device-plugins"
        self.specs = load_default_config().resources
        self.resources = [spec.name for spec in self.specs]
        command = plugin_command or serve_command(self.plugin_dir, log_level)
        self.plugin = PluginProcess(command, workdir / "plugin.log")
        self.manifests = sample_pods()
        self.stories = stories(self.manifests)
        self.began = began
        self.summary: dict[str, Any] = {}

    def emit(self, event: str, **fields: Any) -> None:
        self.view.emit({"event": event, **fields})

    async def run(self) -> None:
        from devplug.simulator import Kubelet

        t0 = time.time()
        kubelet = Kubelet(self.plugin_dir, self.workdir, control_socket=False)
        try:
            self.step(
                1,
                "The kubelet starts and the device plugins register",
                "The kubelet is the agent that runs pods on a Kubernetes node. It knows "
                "nothing about special hardware: a device plugin tells it which devices "
                "exist. Each plugin serves a gRPC socket in the kubelet's device-plugins "
                "folder and announces it on the kubelet's own socket, kubelet.sock; the "
                "kubelet then connects back and receives the device list. Here the "
                "kubelet is a simulator in this process and the plugins are a real "
                "`devplug serve` process.",
            )
            await kubelet.start()
            self.emit(
                "kubelet_started",
                workdir=str(self.workdir),
                registration_socket=str(kubelet.registration_socket),
                pod_resources_socket=str(kubelet.pod_resources_socket),
                ms=round((time.time() - t0) * 1000, 1),
            )
            await self.register(kubelet)
            self.step(
                2,
                "What the node can offer",
                "Once registered, the node advertises each resource: capacity counts "
                "all its devices, allocatable the healthy ones. The scheduler places "
                "pods against these numbers. A device shared by several containers is "
                "listed once per share, as <device>::0, <device>::1, ...",
            )
            self.emit("node", resources=self.node_rows(kubelet))
            await self.admit(kubelet)
            await self.delete(kubelet)
            await self.restart(kubelet)
            self.plugin.check()
            self.emit(
                "summary",
                ok=True,
                seconds=round(time.monotonic() - self.began, 2),
                **self.summary,
            )
        finally:
            # The kubelet first: the plugins then simply wait for it to come back.
            await kubelet.stop()
            await self.plugin.stop()

    def step(self, number: int, title: str, text: str) -> None:
        self.emit("step", number=number, title=title, text=text)

    def node_rows(self, kubelet: Kubelet) -> list[dict[str, Any]]:
        rows = []
        for name in self.resources:
            status = kubelet.resource_status(name)
            if status is None:
                continue
            rows.append(
                {
                    "resource": name,
                    "capacity": status.capacity,
                    "allocatable": status.allocatable,
                    "in_use": status.allocated,
                    "free": sum(1 for d in status.devices if d.healthy and not d.allocated_to),
                    "devices": [d.id for d in status.devices],
                }
            )
        return rows

    async def register(self, kubelet: Kubelet) -> None:

        seq = kubelet.last_event_seq
        pid = await self.plugin.start()
        self.emit(
            "plugin_started",
            pid=pid,
            workdir=str(self.workdir),
            command=self.plugin.command,
            plugin_dir=str(self.plugin_dir),
            config="the packaged default config",
            resources=[{"resource": s.name, "what": describe(s)} for s in self.specs],
        )
        for name in self.resources:
            await self.plugin.guard(
                kubelet.wait_for_resource(name, timeout=FIRST_REGISTRATION_TIMEOUT_S)
            )
        registrations = _registrations_since(kubelet, seq)
        for event in registrations:
            status = _status(kubelet, event.resource)
            self.emit(
                "registered",
                resource=event.resource,
                socket=event.detail,
                devices=status.capacity,
                healthy=status.allocatable,
                ms=round((event.time - self.plugin.started) * 1000, 1),
            )
        self.summary["registered"] = len(registrations)

    async def admit(self, kubelet: Kubelet) -> None:
        self.step(
            3,
            "Pods ask for devices",
            "A pod asks for devices in its resource limits, as it asks for memory. The "
            "kubelet picks free devices, asks the plugin to Allocate them, and adds the "
            "plugin's answer (device nodes, mounts, env vars, annotations, CDI devices) "
            "to the request that makes the container (CRI CreateContainer). A pod "
            "whose devices are not free is refused, with the kubelet's reason.",
        )
        results = await self.plugin.guard(kubelet.apply(self.manifests))
        admitted = rejected = 0
        for pod in results:
            fields: dict[str, Any] = {
                "pod": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
                "story": self.stories.get(pod.name, ""),
                "admitted": pod.admitted,
            }
            if pod.admitted:
                admitted += 1
                fields["containers"] = [
                    {
                        "name": c.name,
                        "init": c.init,
                        "state": c.state,
                        "message": c.message,
                        "devices": c.devices,
                        "options": _builtins(c.options),
                    }
                    for c in pod.containers
                ]
            else:
                rejected += 1
                fields.update(reason=pod.reason, message=pod.message)
            self.emit("pod", **fields)
        holders = {
            f"{pod.namespace}/{pod.name}/{c.name}": device_id
            for pod in results
            if pod.admitted
            for c in pod.containers
            for device_id in c.devices.get(SHARED, [])
        }
        if holders:
            devices = sorted({physical_id(device_id) for device_id in holders.values()})
            self.emit(
                "shared_device",
                resource=SHARED,
                holders=holders,
                devices=devices,
                same_device=len(devices) == 1 and len(holders) > 1,
            )
        self.summary.update(admitted=admitted, rejected=rejected)

    async def delete(self, kubelet: Kubelet) -> None:
        # `fits`; or, where this host lacks one of its device nodes, a pod that did fit.
        name = DELETED_POD
        if kubelet.pod(name, NAMESPACE) is None:
            running = [p.name for p in kubelet.pods() if p.namespace == NAMESPACE]
            if not running:
                raise DemoFailed("no sample pod was admitted, so none can be deleted")
            name = running[0]
        self.step(
            4,
            "A pod goes away and gives its devices back",
            f"Deleting pod {name} releases what it held: the kubelet can hand "
            "those devices to the next pod. Allocatable (the healthy devices) does not "
            "change; the devices in use go down and the free ones up.",
        )
        held = kubelet.pod(name, NAMESPACE)
        freed: dict[str, list[str]] = {}
        for container in held.containers if held is not None else []:
            for resource, ids in container.devices.items():
                freed.setdefault(resource, []).extend(ids)
        before = {r["resource"]: r for r in self.node_rows(kubelet)}
        deleted = await self.plugin.guard(kubelet.delete_pod(name, NAMESPACE))
        if not deleted:
            raise DemoFailed(f"pod {name} was not on the node")
        after = {r["resource"]: r for r in self.node_rows(kubelet)}
        rows = [
            {
                "resource": resource,
                "allocatable": after[resource]["allocatable"],
                "in_use_before": before[resource]["in_use"],
                "in_use_after": after[resource]["in_use"],
                "free_before": before[resource]["free"],
                "free_after": after[resource]["free"],
            }
            for resource in self.resources
            if resource in before and resource in after
        ]
        self.emit("pod_deleted", pod=f"{NAMESPACE}/{name}", freed=freed, resources=rows)
        self.summary["freed"] = sum(len(ids) for ids in freed.values())

    async def restart(self, kubelet: Kubelet) -> None:

        self.step(
            5,
            "The kubelet restarts; the plugins register again",
            "When a kubelet restarts it removes every socket in the device-plugins "
            "folder and serves a new kubelet.sock. It has forgotten the plugins, so "
            "each must notice and register again; devplug watches the folder with "
            "inotify and does so at once. The pods keep their devices: the kubelet "
            "reads them back from its checkpoint file.",
        )
        in_use_before = {r["resource"]: r["in_use"] for r in self.node_rows(kubelet)}
        sockets = sorted(
            p.name for p in self.plugin_dir.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)
        )
        seen = {name: kubelet.registrations(name) for name in self.resources}
        seq = kubelet.last_event_seq
        t0 = time.time()
        await self.plugin.guard(kubelet.restart())
        self.emit(
            "kubelet_restarted", ms=round((time.time() - t0) * 1000, 1), sockets_before=sockets
        )
        for name in self.resources:
            await self.plugin.guard(
                kubelet.wait_for_registration(
                    name, after=seen[name], timeout=REREGISTRATION_TIMEOUT_S
                )
            )
            await self.plugin.guard(
                kubelet.wait_for_resource(name, timeout=REREGISTRATION_TIMEOUT_S)
            )
        times = []
        registrations = _registrations_since(kubelet, seq)
        for event in registrations:
            status = _status(kubelet, event.resource)
            ms = round((event.time - t0) * 1000, 1)
            times.append(ms)
            self.emit(
                "reregistered",
                resource=event.resource,
                socket=event.detail,
                devices=status.capacity,
                healthy=status.allocatable,
                ms=ms,
            )
        in_use_after = {r["resource"]: r["in_use"] for r in self.node_rows(kubelet)}
        self.emit("restored", in_use_before=in_use_before, in_use_after=in_use_after)
        self.summary.update(reregistered=len(registrations), max_reregistration_ms=max(times))


def _registrations_since(kubelet: Kubelet, seq: int) -> list[KubeletEvent]:
    """Each resource's first registration after event `seq`, in the order they came."""
    from devplug.simulator.events import REGISTERED

    first: dict[str, KubeletEvent] = {}
    for event in kubelet.events:
        if event.seq > seq and event.kind == REGISTERED:
            first.setdefault(event.resource, event)
    return sorted(first.values(), key=lambda e: e.seq)


def _status(kubelet: Kubelet, name: str) -> ResourceStatus:
    status = kubelet.resource_status(name)
    if status is None:
        raise DemoFailed(f"{name} is not on the node")
    return status


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


async def _main(
    view: View, workdir: Path, plugin_command: Sequence[str] | None, log_level: str, began: float
) -> int:
    """The story, with SIGINT, SIGTERM and SIGHUP turned into a clean stop."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        if not received:  # a second signal must not break off the clean-up
            received.append(signum)
            task.cancel()

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    demo: Demo | None = None
    try:
        demo = Demo(view, workdir, plugin_command, log_level, began)
        await demo.run()
        return EXIT_OK
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        view.emit({"event": "interrupted", "signal": received[0].name})
        return 128 + received[0].value
    except (DemoFailed, TimeoutError) as error:
        failure: dict[str, Any] = {"event": "error", "message": str(error)}
        if demo is not None:
            failure["plugin_exit_code"] = demo.plugin.returncode
            failure["plugin_stderr"] = demo.plugin.stderr()
        view.emit(failure)
        return EXIT_FAILED
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def _make_workdir() -> Path:
    """A fresh temp folder, short enough for the sockets in it (Unix socket paths have
    at most 107 bytes): under $TMPDIR, or /tmp when that is too deep."""
    workdir = Path(tempfile.mkdtemp(prefix="devplug-demo-"))
    if len(os.fsencode(workdir)) > MAX_WORKDIR_LENGTH:
        workdir.rmdir()
        workdir = Path(tempfile.mkdtemp(prefix="devplug-demo-", dir="/tmp"))
    return workdir


@contextlib.contextmanager
def _logs_to(path: Path, level: str) -> Iterator[None]:
    """This process's logs (the simulator's) go to a file, not into the story."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    try:
        yield
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        handler.close()


def run_demo(
    output: str = "text",
    *,
    keep: bool = False,
    log_level: str = "info",
    plugin_command: Sequence[str] | None = None,
    stream: Any = None,
    errors: Any = None,
) -> int:
    """Run the demo; the exit status (0, 1 on a failure, 128+N on signal N).

    `plugin_command` replaces `devplug serve` (the plugin process) for tests.
    """
    began = time.monotonic()
    view = make_view(output, stream, errors)
    workdir = _make_workdir()
    code = EXIT_FAILED
    try:
        view.emit({"event": "begin", "workdir": str(workdir), "keep": keep})
        with _logs_to(workdir / "kubelet.log", log_level):
            code = asyncio.run(_main(view, workdir, plugin_command, log_level, began))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through its path, before the loop ran
        from devplug.ground.signals import received

        stopped = received() or signal.SIGINT
        view.emit({"event": "interrupted", "signal": stopped.name})
        code = 128 + stopped.value
    except BrokenPipeError:
        code = EXIT_FAILED
    finally:
        if keep:
            with contextlib.suppress(BrokenPipeError):
                view.emit({"event": "kept", "workdir": str(workdir)})
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(BrokenPipeError):
            view.close()
    return code
