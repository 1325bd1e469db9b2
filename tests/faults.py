"""Fault scenarios: the real `devplug serve` process against the kubelet simulator.

Each scenario takes an iteration count and returns an `Outcome` (failures, leaks,
wall time); tests/process/test_faults.py runs short versions and asserts a clean outcome,
tests/soak.py (`make soak`) long ones and prints the table. Nothing waits for a
fixed time: every wait is for an event (a registration, a device list, a file, a
log line), and the "random moments" of the faults are chosen by counting events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import grpc
from asyncinotify import Inotify, Mask

from devplug.api.constants import HEALTHY, KUBELET_SOCKET
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.debug import DEBUG_STATE_ENV
from devplug.framework.plugin import default_socket_name
from devplug.ground.channel import unix_channel
from devplug.ground.process import ChildProcess
from devplug.ground.unixserver import UnixServer
from devplug.simulator import Kubelet
from devplug.simulator.results import REASON_UNEXPECTED_ADMISSION
from devplug.testing import pod_manifest

VIRT = "fault.devplug.io/virt"
NODE = "fault.devplug.io/node"
WAIT_S = 30.0
RSS_GROWTH_LIMIT_MIB = 5.0
# The same (1, 3) as /dev/null: a real character device, harmless to open.
NULL_DEV = os.makedev(1, 3)


# -- outcome ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a daemon holds at one quiet moment."""

    fds: int
    threads: int
    tasks: int
    sockets: int
    rss_kib: int

    def growth(self, later: Snapshot) -> dict[str, int]:
        return {f.name: getattr(later, f.name) - getattr(self, f.name) for f in fields(self)}


@dataclass
class Outcome:
    scenario: str
    iterations: int = 0
    failures: list[str] = field(default_factory=list)
    # kind -> growth over the run (rss in KiB), for the kinds that were counted
    growth: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    @property
    def leaks(self) -> list[str]:
        """Counted things that grew: fds, threads, tasks, sockets at all; RSS by 5 MiB."""
        found = [f"{k} +{v}" for k, v in self.growth.items() if k != "rss_kib" and v > 0]
        rss = self.growth.get("rss_kib", 0)
        if rss > RSS_GROWTH_LIMIT_MIB * 1024:
            found.append(f"rss +{rss / 1024:.1f} MiB")
        return found

    def summary(self) -> str:
        return (
            f"{self.scenario}: {self.iterations} iterations, {len(self.failures)} failures "
            f"{self.failures[:3]}, leaks {self.leaks}, growth {self.growth}; {self.notes}"
        )


# -- waiting on files --------------------------------------------------------------------


async def wait_for_path(
    path: Path, ready: Callable[[], bool], what: str, timeout: float = WAIT_S
) -> None:
    """Return once `ready()` holds, re-checking on every change in `path`'s folder."""
    mask = (
        Mask.CREATE
        | Mask.MOVED_TO
        | Mask.MODIFY
        | Mask.CLOSE_WRITE
        | Mask.DELETE
        | Mask.ATTRIB
        | Mask.MOVED_FROM
    )
    with Inotify() as inotify:
        inotify.add_watch(path.parent, mask)
        try:
            async with asyncio.timeout(timeout):
                if ready():
                    return
                async for _ in inotify:
                    if ready():
                        return
        except TimeoutError:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}") from None


# -- the daemon ------------------------------------------------------------------------


# Run before the daemon, in the child: give up root's power to ignore file permissions
# (so that a folder's mode bits apply, as in the DaemonSet, which drops every
# capability), then exec the daemon; it stays uid 0, owner of its own files. A
# trampoline, not a preexec_fn: forking a threaded test process and calling into libc
# before exec can deadlock.
WITHOUT_DAC_OVERRIDE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


class Serve:
    """`devplug serve` as a child process, with its log and a state dump on SIGUSR1."""

    def __init__(
        self, root: Path, config: str | None, plugin_dir: Path, name: str = "serve"
    ) -> None:
        """`config` None: the packaged default config (no --config)."""
        self.root = root
        self.plugin_dir = plugin_dir
        self.config: Path | None = None
        if config is not None:
            self.config = root / f"{name}.yaml"
            self.config.write_text(config)
        self.log_path = root / f"{name}.log"
        self.log_path.touch()
        self.state_dir = root / f"{name}-state"
        self.state_dir.mkdir(exist_ok=True)
        self.proc: ChildProcess | None = None
        self.starts = 0
        self.started_at = 0.0
        self.baseline_names: dict[str, int] = {}

    @property
    def state(self) -> Path:
        return self.state_dir / f"state-{self.starts}.json"

    def start(self, *, without_dac_override: bool = False, log_level: str = "info") -> None:
        self.starts += 1
        env = {**os.environ, DEBUG_STATE_ENV: str(self.state)}
        args = [sys.executable, "-m", "devplug.cli.main", "serve"]
        if without_dac_override:
            args[1:1] = ["-c", WITHOUT_DAC_OVERRIDE]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += ["--plugin-dir", str(self.plugin_dir), "--log-level", log_level]
        with open(self.log_path, "ab") as log:
            self.started_at = time.time()
            self.proc = ChildProcess(args, env=env, stdout=subprocess.DEVNULL, stderr=log)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self) -> int:
        assert self.proc is not None
        return await self.proc.stop()

    async def kill(self) -> None:
        assert self.proc is not None
        await self.proc.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for_log(self, pattern: str, count: int = 1) -> list[str]:
        """The log lines matching `pattern` once there are `count` of them."""
        regex = re.compile(pattern)

        def lines() -> list[str]:
            return [line for line in self.log().splitlines() if regex.search(line)]

        await wait_for_path(self.log_path, lambda: len(lines()) >= count, f"log {pattern!r}")
        return lines()

    def _state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return {"seq": 0}
        return data

    def task_names(self) -> dict[str, int]:
        names: dict[str, int] = self._state().get("task_names", {})
        return names

    async def tasks(self) -> int:
        """asyncio tasks in the daemon, from its SIGUSR1 dump."""
        assert self.proc is not None
        before = self._state()["seq"]
        self.proc.send_signal(signal.SIGUSR1)
        await wait_for_path(self.state, lambda: self._state()["seq"] > before, "state dump")
        return int(self._state()["tasks"])

    async def snapshot(self) -> Snapshot:
        tasks = await self.tasks()
        proc = Path(f"/proc/{self.pid}")
        rss = next(
            int(line.split()[1])
            for line in (proc / "status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        return Snapshot(
            fds=len(os.listdir(proc / "fd")),
            threads=len(os.listdir(proc / "task")),
            tasks=tasks,
            sockets=sum(1 for p in self.plugin_dir.iterdir() if p.is_socket()),
            rss_kib=rss,
        )

    async def settled(
        self, baseline: Snapshot | None = None, probes: int = 8, patience_s: float = 5.0
    ) -> Snapshot:
        """The lowest counts over a few probes: a connection a peer just closed leaves
        the daemon's fd table a moment later, and the task of an RPC whose answer the
        client already has ends once gRPC's poller thread has run, later on a busy
        machine (each probe is a round trip through the daemon's loop). With a
        `baseline`, stops once nothing is above it, and goes on probing past `probes`
        for up to `patience_s` while something is: only a leak outlasts that."""
        best: Snapshot | None = None
        deadline = time.monotonic() + patience_s
        count = 0
        while count < probes or (baseline is not None and time.monotonic() < deadline):
            count += 1
            snap = await self.snapshot()
            if best is not None:
                snap = Snapshot(
                    *(min(getattr(best, f.name), getattr(snap, f.name)) for f in fields(snap))
                )
            best = snap
            if baseline is not None and all(v <= 0 for v in baseline.growth(best).values()):
                break
        assert best is not None
        return best


@contextlib.asynccontextmanager
async def serving(serve: Serve) -> AsyncIterator[Serve]:
    if not serve.running:
        serve.start()
    try:
        yield serve
    finally:
        if serve.running:
            await serve.stop()


# -- configs and devices -------------------------------------------------------------------


def virt_config(count: int = 8, limits: str = "") -> str:
    return f"resources:\n  - name: {VIRT}\n    virtual: {count}\n{limits}"


def node_config(dev: Path, replicas: int = 2, with_virt: int = 0, limits: str = "") -> str:
    text = (
        f"resources:\n  - name: {NODE}\n    count: {replicas}\n    allowAnyPath: true\n"
        f"    groups:\n      - paths:\n          - path: {dev}/fault*\n"
    )
    if with_virt:
        text += f"  - name: {VIRT}\n    virtual: {with_virt}\n"
    return text + limits


def make_nodes(dev: Path, count: int) -> list[Path]:
    dev.mkdir(parents=True, exist_ok=True)
    nodes = [dev / f"fault{i}" for i in range(count)]
    for node in nodes:
        os.mknod(node, stat.S_IFCHR | 0o666, NULL_DEV)
    return nodes


def toggle(node: Path) -> None:
    if node.exists():
        node.unlink()
    else:
        os.mknod(node, stat.S_IFCHR | 0o666, NULL_DEV)


def restore(node: Path) -> None:
    if not node.exists():
        toggle(node)


def new_kubelet(root: Path, plugin_dir: Path) -> Kubelet:
    return Kubelet(plugin_dir, root / "kubelet-state", control_socket=False)


def allocate_request(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


def pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return pod_manifest(name, {"c": {resource: count}})


def held(kubelet: Kubelet, name: str, resource: str) -> list[str]:
    result = kubelet.pod(name)
    if result is None or not result.containers:
        return []
    return list(result.containers[0].devices.get(resource, []))


class ListWatcher:
    """A ListAndWatch client of its own on a plugin socket, keeping every list it got."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.lists: list[dict[str, bool]] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ListWatcher:
        self._task = asyncio.create_task(self._run())
        await self.wait(lambda lists: bool(lists), "the first list")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        async with unix_channel(self.socket_path) as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            async for message in stream:
                self.lists.append({d.ID: d.health == HEALTHY for d in message.devices})
                self._changed.set()

    async def wait(
        self, ready: Callable[[list[dict[str, bool]]], bool], what: str, timeout: float = WAIT_S
    ) -> None:
        async with asyncio.timeout(timeout):
            while not ready(self.lists):
                self._changed.clear()
                if self._task is not None and self._task.done():
                    self._task.result()
                    raise RuntimeError("the ListAndWatch stream ended")
                await self._changed.wait()


# -- 1. kubelet restart storm ------------------------------------------------------------


async def restart_storm(root: Path, rounds: int, seed: int = 1) -> Outcome:
    """Kubelet restarts at random moments: among Allocate calls in flight, right after
    a device change (the daemon is sending ListAndWatch updates), or idle. After each
    the plugin is registered again with the right capacity and allocatable devices;
    fds, threads, tasks and sockets are counted after a warm-up and at the end."""
    out = Outcome("kubelet restart storm")
    rng = random.Random(seed)
    plugin_dir, dev = root / "plugins", root / "dev"
    nodes = make_nodes(dev, 4)
    flapper = nodes[3]
    started = time.monotonic()
    async with (
        new_kubelet(root, plugin_dir) as kubelet,
        serving(Serve(root, node_config(dev, 2, with_virt=8), plugin_dir)) as serve,
    ):
        await kubelet.wait_for_resource(VIRT, count=8, timeout=WAIT_S)
        await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
        virt_socket = plugin_dir / default_socket_name(VIRT)
        warmup = min(5, max(1, rounds // 4))
        baseline: Snapshot | None = None
        modes: dict[str, int] = {}
        for round_ in range(1, rounds + 1):
            mode = rng.choice(("allocate", "send", "idle"))
            modes[mode] = modes.get(mode, 0) + 1
            async with unix_channel(virt_socket) as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                calls: list[asyncio.Future[pb.AllocateResponse]] = []
                if mode == "allocate":
                    ids = [f"virt-{i}" for i in range(8)]
                    calls = [
                        asyncio.ensure_future(
                            stub.Allocate(allocate_request(*rng.sample(ids, 2)), timeout=WAIT_S)
                        )
                        for _ in range(rng.randint(1, 8))
                    ]
                    # Restart after a random number of them were answered.
                    for call in calls[: rng.randint(0, len(calls) - 1)]:
                        with contextlib.suppress(grpc.aio.AioRpcError):
                            await call
                elif mode == "send":
                    for _ in range(rng.randint(1, 4)):
                        toggle(flapper)
                await kubelet.restart()
                for resource in (VIRT, NODE):
                    await kubelet.wait_for_registration(resource, after=round_, timeout=WAIT_S)
                await kubelet.wait_for_resource(VIRT, count=8, capacity=8, timeout=WAIT_S)
                healthy_nodes = 8 if flapper.exists() else 6
                await kubelet.wait_for_resource(
                    NODE, count=healthy_nodes, capacity=8, timeout=WAIT_S
                )
                for call in calls:
                    try:
                        response = await call
                    except grpc.aio.AioRpcError as error:
                        out.check(
                            error.code()
                            in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED),
                            f"round {round_}: Allocate in flight failed with {error.code()}",
                        )
                        continue
                    out.check(
                        len(response.container_responses) == 1
                        and "DEVPLUG_FAULT_DEVPLUG_IO_VIRT" in response.container_responses[0].envs,
                        f"round {round_}: wrong Allocate answer {response}",
                    )
            out.iterations = round_
            if round_ == warmup:
                restore(flapper)
                await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
                baseline = await serve.settled()
                serve.baseline_names = serve.task_names()
        restore(flapper)
        await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
        out.check(serve.running, "the daemon exited")
        out.check(
            {p.name for p in plugin_dir.iterdir()}
            == {KUBELET_SOCKET, default_socket_name(VIRT), default_socket_name(NODE)},
            f"plugin folder: {sorted(p.name for p in plugin_dir.iterdir())}",
        )
        if baseline is not None:
            out.growth = baseline.growth(await serve.settled(baseline))
            if out.growth["tasks"] > 0:
                out.notes.append(f"tasks {serve.baseline_names} -> {serve.task_names()}")
        out.notes.append(f"moments {modes}")
    out.wall_s = time.monotonic() - started
    return out


# -- 2. plugin SIGKILL with pods holding devices -------------------------------------------


async def sigkill_with_pods(root: Path, rounds: int) -> Outcome:
    """SIGKILL the daemon while pods hold devices (every other round the kubelet also
    restarts while it is down); once it is back the same devices stay allocated, new
    pods get only free ones, nothing is handed out twice."""
    out = Outcome("plugin SIGKILL with pods")
    plugin_dir = root / "plugins"
    started = time.monotonic()
    serve = Serve(root, virt_config(6), plugin_dir)
    async with new_kubelet(root, plugin_dir) as kubelet, serving(serve):
        await kubelet.wait_for_resource(VIRT, count=6, timeout=WAIT_S)
        for round_ in range(1, rounds + 1):
            names = [f"hold-{round_}-{i}" for i in range(2)]
            results = await kubelet.apply([pod(n, VIRT, 2) for n in names])
            out.check(all(r.admitted for r in results), f"round {round_}: {results}")
            before = {n: held(kubelet, n, VIRT) for n in names}
            registrations = kubelet.registrations(VIRT)
            await serve.kill()
            if round_ % 2 == 0:
                await kubelet.restart()  # allocations come back from the checkpoint
            serve.start()
            await kubelet.wait_for_registration(VIRT, after=registrations, timeout=WAIT_S)
            status = await kubelet.wait_for_resource(VIRT, count=6, timeout=WAIT_S)
            after = {n: held(kubelet, n, VIRT) for n in names}
            out.check(after == before, f"round {round_}: held {before}, then {after}")
            out.check(status.allocated == 4, f"round {round_}: {status.allocated} allocated")
            fill, over = await kubelet.apply(
                [pod(f"fill-{round_}", VIRT, 2), pod(f"over-{round_}", VIRT, 1)]
            )
            given = [d for n in [*names, fill.name] for d in held(kubelet, n, VIRT)]
            out.check(fill.admitted, f"round {round_}: the free devices were refused: {fill}")
            out.check(len(given) == len(set(given)) == 6, f"round {round_}: handed out {given}")
            out.check(
                not over.admitted and over.reason == REASON_UNEXPECTED_ADMISSION,
                f"round {round_}: a 7th device was given: {over}",
            )
            for name in [*names, fill.name]:
                await kubelet.delete_pod(name)
            out.iterations = round_
    out.wall_s = time.monotonic() - started
    return out


# -- 3. device flapping ----------------------------------------------------------------------


async def flapping(root: Path, flips: int) -> Outcome:
    """One of four device nodes removed and restored `flips` times as fast as the test
    can; every list on a ListAndWatch stream is one that existed (all four devices,
    the three steady ones healthy, both replicas of the flapping one alike), and the
    final state is all healthy, in the stream and in the kubelet (a fifth node made
    after the last flip marks the lists that come after it)."""
    out = Outcome("device flapping")
    plugin_dir, dev = root / "plugins", root / "dev"
    nodes = make_nodes(dev, 4)
    started = time.monotonic()
    async with (
        new_kubelet(root, plugin_dir) as kubelet,
        serving(Serve(root, node_config(dev, 2), plugin_dir)) as serve,
    ):
        status = await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
        ids = {d.id for d in status.devices}
        flapping_ids = {i for i in ids if "fault0" in i}
        counts: set[str] = set()
        kubelet.add_listener(
            lambda e: counts.add(e.detail) if e.kind == "devices" and e.resource == NODE else None
        )
        async with ListWatcher(plugin_dir / default_socket_name(NODE)) as watcher:
            before = await serve.settled()
            for i in range(flips):
                nodes[0].unlink()
                if i % 10 == 0:
                    # Every tenth flip is seen through, both ways, so that the stream
                    # carries real changes, not only the lists between bursts.
                    await watcher.wait(
                        lambda lists: not any(lists[-1][d] for d in flapping_ids), f"flip {i}"
                    )
                os.mknod(nodes[0], stat.S_IFCHR | 0o666, NULL_DEV)
                if i % 10 == 0:
                    await watcher.wait(
                        lambda lists: all(lists[-1][d] for d in flapping_ids), f"flip {i} back"
                    )
            # A marker node made after the last flip: the first list that has it comes
            # from a look at the folder after every flip, so from there on all is healthy.
            os.mknod(dev / "fault4", stat.S_IFCHR | 0o666, NULL_DEV)
            await watcher.wait(lambda lists: len(lists[-1]) == 10, "the list after the flips")
            await kubelet.wait_for_resource(NODE, count=10, timeout=WAIT_S)
            marked = next(n for n, listed in enumerate(watcher.lists) if len(listed) == 10)
            for n, listed in enumerate(watcher.lists):
                new = set(listed) - ids
                out.check(set(listed) >= ids and len(new) in (0, 2), f"list {n}: {sorted(listed)}")
                steady = [listed[i] for i in set(listed) - flapping_ids]
                out.check(all(steady), f"list {n}: a steady device unhealthy")
                out.check(
                    len({listed.get(i) for i in flapping_ids}) == 1,
                    f"list {n}: replicas of one node disagree",
                )
                if n >= marked:
                    out.check(all(listed.values()), f"list {n}: unhealthy after the flips")
            valid = {"8/8 healthy", "6/8 healthy", "10/10 healthy"}
            out.check(counts <= valid, f"kubelet saw {counts}")
            out.notes.append(f"{len(watcher.lists)} lists streamed")
        out.growth = before.growth(await serve.settled(before))
        out.iterations = flips
    out.wall_s = time.monotonic() - started
    return out


# -- 4. socket folder trouble -------------------------------------------------------------


async def folder_missing_at_start(root: Path) -> list[str]:
    """Started before the folder (and its parent) exist: it makes them and serves."""
    problems: list[str] = []
    plugin_dir = root / "later" / "plugins"
    async with serving(Serve(root, virt_config(3), plugin_dir)) as serve:
        socket_path = plugin_dir / default_socket_name(VIRT)
        # Each step watches a folder that exists, then looks: nothing is missed.
        for path in (plugin_dir.parent, plugin_dir):
            await wait_for_path(path, path.is_dir, f"{path}")
        await wait_for_path(socket_path, socket_path.is_socket, "the plugin socket")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            if kubelet.registrations(VIRT) != 1:
                problems.append(f"{kubelet.registrations(VIRT)} registrations")
        if not serve.running:
            problems.append("the daemon exited")
    return problems


async def folder_deleted_while_serving(root: Path) -> list[str]:
    """The whole folder removed under a serving daemon, then a kubelet starts in a new
    one: the daemon serves again there and registers."""
    import shutil

    problems: list[str] = []
    plugin_dir = root / "plugins"
    async with serving(Serve(root, virt_config(3), plugin_dir)) as serve:
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            await kubelet.stop()
            # Moved out of the way, then deleted: a daemon quick to serve again cannot
            # slip a new socket into the folder while it is being emptied.
            gone = root / "gone"
            plugin_dir.rename(gone)
            shutil.rmtree(gone)
            await kubelet.start()
            await kubelet.wait_for_registration(VIRT, after=1, timeout=WAIT_S)
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
        if not serve.running:
            problems.append("the daemon exited")
    return problems


def dead_socket(path: Path) -> None:
    """A socket file nobody serves, as a killed process leaves it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.close()


async def stale_socket_of_the_same_name(root: Path) -> list[str]:
    """A dead socket at the plugin's path is replaced; a regular file or a symbolic
    link there is left alone (with an error in the log) until it goes away."""
    problems: list[str] = []
    plugin_dir = root / "plugins"
    plugin_dir.mkdir()
    outside = root / "precious"
    outside.write_text("keep me")
    socket_path = plugin_dir / default_socket_name(VIRT)
    for kind in ("dead socket", "file", "symlink"):
        if kind == "dead socket":
            dead_socket(socket_path)
        elif kind == "file":
            socket_path.write_text("not mine")
        else:
            socket_path.symlink_to(outside)
        serve = Serve(root, virt_config(3), plugin_dir, name=f"serve-{kind.replace(' ', '-')}")
        async with new_kubelet(root, plugin_dir) as kubelet, serving(serve):
            if kind != "dead socket":
                await serve.wait_for_log("not removed|left alone")
                if kind == "file" and socket_path.read_text() != "not mine":
                    problems.append("the file was changed")
                if kind == "symlink" and not (
                    socket_path.is_symlink() and outside.read_text() == "keep me"
                ):
                    problems.append("the link or its target was changed")
                socket_path.unlink()  # the owner clears it: the daemon serves at once
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            if not serve.running:
                problems.append(f"{kind}: the daemon exited")
    return problems


async def permission_denied(root: Path) -> list[str]:
    """A folder the daemon may not write: a clear error (at error level once, then at
    debug), retried with backoff (the delays double), served as soon as the permission
    is given."""
    problems: list[str] = []
    plugin_dir = root / "plugins"
    plugin_dir.mkdir(mode=0o555)
    plugin_dir.chmod(0o555)
    serve = Serve(root, virt_config(3), plugin_dir)
    serve.start(without_dac_override=True, log_level="debug")
    async with serving(serve):
        lines = await serve.wait_for_log(r"Permission denied; retrying in", count=2)
        levels = [line.split()[1] for line in lines[:2]]
        if levels != ["ERROR", "DEBUG"]:
            problems.append(f"the cause said more than once: {levels}")
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        if delays[1] <= delays[0]:
            problems.append(f"no backoff: {delays}")
        if not serve.running:
            problems.append("the daemon exited")
        socket_path = plugin_dir / default_socket_name(VIRT)
        plugin_dir.chmod(0o755)
        await wait_for_path(socket_path, socket_path.is_socket, "the socket after the fix")
        if stat.S_IMODE(socket_path.stat().st_mode) != 0o600:
            problems.append(f"socket mode {oct(socket_path.stat().st_mode)}")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
    return problems


async def folder_cannot_be_made(root: Path) -> list[str]:
    """The folder is missing and its parent may not be written: a clear error,
    retried with backoff instead of exiting; made and served once that is fixed."""
    problems: list[str] = []
    parent = root / "readonly"
    parent.mkdir()
    parent.chmod(0o555)
    plugin_dir = parent / "plugins"
    serve = Serve(root, virt_config(3), plugin_dir)
    serve.start(without_dac_override=True, log_level="debug")
    async with serving(serve):
        lines = await serve.wait_for_log(r"cannot create the plugin folder .*retrying in", 2)
        levels = [line.split()[1] for line in lines[:2]]
        if levels != ["ERROR", "DEBUG"]:
            problems.append(f"the cause said more than once: {levels}")
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        if delays[1] <= delays[0]:
            problems.append(f"no backoff: {delays}")
        if not serve.running:
            problems.append("the daemon exited")
        parent.chmod(0o755)
        socket_path = plugin_dir / default_socket_name(VIRT)
        for path in (plugin_dir, socket_path):
            await wait_for_path(path, path.exists, f"{path} after the fix")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
    return problems


FOLDER_TROUBLES = {
    "parent not writable": folder_cannot_be_made,
    "missing at start": folder_missing_at_start,
    "deleted while serving": folder_deleted_while_serving,
    "stale socket of the same name": stale_socket_of_the_same_name,
    "permission denied": permission_denied,
}


async def folder_trouble(root: Path, rounds: int) -> Outcome:
    out = Outcome("socket folder trouble")
    started = time.monotonic()
    for round_ in range(1, rounds + 1):
        for name, scenario in FOLDER_TROUBLES.items():
            where = root / f"{round_}-{name.split()[0]}"
            where.mkdir()
            for problem in await scenario(where):
                out.failures.append(f"round {round_}: {name}: {problem}")
        out.iterations = round_
    out.wall_s = time.monotonic() - started
    return out


# -- 5. a slow or stuck kubelet ------------------------------------------------------------


class HangingRegistration(pb_grpc.RegistrationServicer):
    """A kubelet whose Register never answers."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.changed = asyncio.Event()
        self._never = asyncio.Event()

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.Empty:
        self.calls.append(request.resource_name)
        self.changed.set()
        await self._never.wait()
        return pb.Empty()

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.calls) < count:
                self.changed.clear()
                await self.changed.wait()


async def hanging_register(root: Path, rounds: int) -> Outcome:
    """Register hangs: the call times out (limits.registerTimeoutSeconds), is retried
    with growing delays, Allocate is answered meanwhile, and a real kubelet that comes
    later gets the registration at once."""
    out = Outcome("Register hangs")
    plugin_dir = root / "plugins"
    plugin_dir.mkdir()
    started = time.monotonic()
    limits = "limits:\n  registerTimeoutSeconds: 1\n"  # a loaded real kubelet fits in 1 s
    async with serving(Serve(root, virt_config(3, limits), plugin_dir)) as serve:
        before: Snapshot | None = None
        for round_ in range(1, rounds + 1):
            hanging = HangingRegistration()
            server = UnixServer(
                plugin_dir / KUBELET_SOCKET,
                lambda s, h=hanging: pb_grpc.add_RegistrationServicer_to_server(h, s),
            )
            await server.start()
            await hanging.wait_calls(3)
            async with unix_channel(plugin_dir / default_socket_name(VIRT)) as channel:
                answer = await pb_grpc.DevicePluginStub(channel).Allocate(
                    allocate_request("virt-0"), timeout=WAIT_S, wait_for_ready=True
                )
                out.check(len(answer.container_responses) == 1, "Allocate while Register hangs")
            await server.stop(0)
            async with new_kubelet(root, plugin_dir) as kubelet:
                await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
                if before is None:
                    before = await serve.settled()
                else:
                    out.growth = before.growth(await serve.settled(before))
            out.iterations = round_
        lines = await serve.wait_for_log(r"registration refused \(DEADLINE_EXCEEDED\)", 2)
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        out.check(delays[1] > delays[0], f"no backoff between Register attempts: {delays}")
        out.check(serve.running, "the daemon exited")
    out.wall_s = time.monotonic() - started
    return out


def stalled_list_and_watch(socket_path: Path) -> socket.socket:
    """A raw HTTP/2 client that opens ListAndWatch and never reads a byte."""
    import h2.config
    import h2.connection
    import h2.settings

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(os.fspath(socket_path))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4096})
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, grpc_headers("/v1beta1.DevicePlugin/ListAndWatch"))
    conn.send_data(stream, b"\0\0\0\0\0", end_stream=True)  # one empty message
    sock.sendall(conn.data_to_send())
    return sock


def grpc_headers(path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


async def stalled_reader(root: Path, flips: int) -> Outcome:
    """ListAndWatch clients that never read while the device list (2,000 devices)
    changes `flips` times: the daemon's memory stays bounded, another reader gets every
    change, Allocate is answered throughout, and what the stalled streams held is
    released with their connections (counted after a warm-up round: gRPC opens one
    fd the first time a stream stalls, and keeps it)."""
    out = Outcome("ListAndWatch client never reads")
    plugin_dir, dev = root / "plugins", root / "dev"
    nodes = make_nodes(dev, 4)
    started = time.monotonic()
    async with (
        new_kubelet(root, plugin_dir) as kubelet,
        serving(Serve(root, node_config(dev, 500), plugin_dir)) as serve,
    ):
        devices = (await kubelet.wait_for_resource(NODE, count=2000, timeout=WAIT_S)).devices
        steady_id = next(d.id for d in devices if "fault1" in d.id)
        socket_path = plugin_dir / default_socket_name(NODE)

        async def stall(count: int) -> None:
            stalled = [stalled_list_and_watch(socket_path) for _ in range(3)]
            try:
                async with ListWatcher(socket_path) as watcher, unix_channel(socket_path) as ch:
                    stub = pb_grpc.DevicePluginStub(ch)
                    for i in range(count):
                        toggle(nodes[0])
                        seen = len(watcher.lists)
                        await watcher.wait(lambda lists, n=seen: len(lists) > n, f"list {i}")
                        if i % 10 == 0:
                            answer = await stub.Allocate(
                                allocate_request(steady_id), timeout=WAIT_S, wait_for_ready=True
                            )
                            out.check(len(answer.container_responses) == 1, f"Allocate {i}")
                    restore(nodes[0])
                    await watcher.wait(lambda lists: all(lists[-1].values()), "the final list")
                    await kubelet.wait_for_resource(NODE, count=2000, timeout=WAIT_S)
            finally:
                for sock in stalled:
                    sock.close()

        await stall(5)
        before = await serve.settled()
        await stall(flips)
        out.iterations = flips
        out.growth = before.growth(await serve.settled(before, probes=20))
        out.check(serve.running, "the daemon exited")
    out.wall_s = time.monotonic() - started
    return out


# -- 6. node reboot order ---------------------------------------------------------------


async def reboot_order(root: Path, rounds: int) -> Outcome:
    """The node reboots: the kubelet comes back first with a pod still bound and its
    allocation in the checkpoint; a pod admitted before the daemon registers fails
    with UnexpectedAdmissionError; once registered (timed from the daemon's start)
    new pods are admitted on the free devices only."""
    out = Outcome("node reboot order")
    plugin_dir = root / "plugins"
    started = time.monotonic()
    windows: list[float] = []
    serve = Serve(root, virt_config(4), plugin_dir)
    async with new_kubelet(root, plugin_dir) as kubelet:
        serve.start()
        await kubelet.wait_for_resource(VIRT, count=4, timeout=WAIT_S)
        (bound,) = await kubelet.apply([pod("bound", VIRT, 1)])
        out.check(bound.admitted, f"{bound}")
        held_before = held(kubelet, "bound", VIRT)
        for round_ in range(1, rounds + 1):
            await serve.kill()  # the power goes
            await kubelet.stop()
            await kubelet.start()  # the kubelet is up first
            (early,) = await kubelet.apply([pod(f"early-{round_}", VIRT, 1)])
            out.check(
                not early.admitted and early.reason == REASON_UNEXPECTED_ADMISSION,
                f"round {round_}: a pod before registration: {early}",
            )
            registrations = kubelet.registrations(VIRT)
            serve.start()
            event = (
                await kubelet.wait_for_event(
                    "registered", resource=VIRT, after=kubelet.last_event_seq
                )
                if kubelet.registrations(VIRT) == registrations
                else None
            )
            await kubelet.wait_for_resource(VIRT, count=4, timeout=WAIT_S)
            if event is not None:
                windows.append((event.time - serve.started_at) * 1000)
            out.check(held(kubelet, "bound", VIRT) == held_before, f"round {round_}: bound pod")
            (late,) = await kubelet.apply([pod(f"late-{round_}", VIRT, 1)])
            late_ids = held(kubelet, late.name, VIRT)
            out.check(
                late.admitted and not set(late_ids) & set(held_before),
                f"round {round_}: after registration: {late}",
            )
            await kubelet.delete_pod(late.name)
            out.iterations = round_
        await serve.stop()
    if windows:
        out.notes.append(f"start->registered median {sorted(windows)[len(windows) // 2]:.0f} ms")
    out.wall_s = time.monotonic() - started
    return out


# -- 7. concurrency ---------------------------------------------------------------------


async def concurrent_clients(root: Path, calls_per_client: int, clients: int = 16) -> Outcome:
    """`clients` clients call Allocate and GetPreferredAllocation while one device
    node flaps: every answer is one a device list that existed would give (the right
    container edits for the IDs asked; a refusal only for the flapping device)."""
    out = Outcome(f"{clients} concurrent clients")
    plugin_dir, dev = root / "plugins", root / "dev"
    nodes = make_nodes(dev, 4)
    started = time.monotonic()
    async with (
        new_kubelet(root, plugin_dir) as kubelet,
        serving(Serve(root, node_config(dev, 2), plugin_dir)) as serve,
    ):
        status = await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
        before = await serve.settled()
        serve.baseline_names = serve.task_names()
        ids = sorted(d.id for d in status.devices)
        node_of = {i: str(dev / i.split("-")[-1].split(":")[0]) for i in ids}
        flapping_ids = {i for i in ids if "fault0" in i}
        socket_path = plugin_dir / default_socket_name(NODE)
        stop = asyncio.Event()

        async def flap() -> None:
            while not stop.is_set():
                toggle(nodes[0])
                await asyncio.sleep(0)

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            async with unix_channel(socket_path) as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                for _ in range(calls_per_client):
                    if rng.random() < 0.5:
                        await check_allocate(stub, rng.sample(ids, rng.randint(1, 3)))
                    else:
                        await check_preferred(stub, rng)

        async def check_allocate(stub: pb_grpc.DevicePluginStub, asked: list[str]) -> None:
            try:
                answer = await stub.Allocate(
                    allocate_request(*asked), timeout=WAIT_S, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as error:
                out.check(
                    error.code() == grpc.StatusCode.FAILED_PRECONDITION
                    and bool(flapping_ids & set(asked)),
                    f"Allocate {asked}: {error.code()} {error.details()}",
                )
                return
            (container,) = answer.container_responses
            got = {d.host_path for d in container.devices}
            out.check(got == {node_of[i] for i in asked}, f"Allocate {asked}: nodes {got}")
            env = container.envs.get("DEVPLUG_FAULT_DEVPLUG_IO_NODE", "")
            out.check(env.split(",") == asked, f"Allocate {asked}: env {env}")

        async def check_preferred(stub: pb_grpc.DevicePluginStub, rng: random.Random) -> None:
            available = rng.sample(ids, rng.randint(1, len(ids)))
            must = rng.sample(available, rng.randint(0, min(2, len(available))))
            size = rng.randint(len(must), len(available))
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must,
                        allocation_size=size,
                    )
                ]
            )
            answer = await stub.GetPreferredAllocation(request, timeout=WAIT_S, wait_for_ready=True)
            (picked,) = answer.container_responses
            chosen = list(picked.deviceIDs)
            out.check(
                len(chosen) == size and set(must) <= set(chosen) <= set(available),
                f"preferred {available} {must} {size}: {chosen}",
            )

        flapper = asyncio.create_task(flap())
        try:
            await asyncio.gather(*(client(seed) for seed in range(clients)))
        finally:
            stop.set()
            await flapper
        out.iterations = clients * calls_per_client
        restore(nodes[0])
        await kubelet.wait_for_resource(NODE, count=8, timeout=WAIT_S)
        out.growth = before.growth(await serve.settled(before))
        if out.growth["tasks"] > 0:
            out.notes.append(f"tasks {serve.baseline_names} -> {serve.task_names()}")
    out.wall_s = time.monotonic() - started
    return out


SCENARIOS: dict[str, Callable[[Path, int], Any]] = {
    "restart_storm": restart_storm,
    "sigkill_with_pods": sigkill_with_pods,
    "flapping": flapping,
    "folder_trouble": folder_trouble,
    "hanging_register": hanging_register,
    "stalled_reader": stalled_reader,
    "reboot_order": reboot_order,
    "concurrent_clients": concurrent_clients,
}


def table(outcomes: Sequence[Outcome]) -> str:
    from devplug.ground.tables import table as text_table

    rows = [
        [
            o.scenario,
            str(o.iterations),
            str(len(o.failures)),
            (", ".join(o.leaks) or "none") if o.growth else "not counted",
            f"{o.wall_s:.1f} s",
        ]
        for o in outcomes
    ]
    return "\n".join(text_table(["scenario", "iterations", "failures", "leaks", "wall time"], rows))
