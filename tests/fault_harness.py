"""What the fault scenarios (tests/faults.py) run on: the real `devplug serve` process
with a window into its tasks, the kubelet simulator, configs and device nodes, waits
on files, and the Outcome each scenario returns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from asyncinotify import Inotify, Mask

from devplug.api.constants import HEALTHY
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.debug import DEBUG_STATE_ENV
from devplug.ground.channel import unix_channel
from devplug.ground.process import ChildProcess
from devplug.simulator import Kubelet
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
