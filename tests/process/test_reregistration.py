"""`devplug serve` as a real process against the kubelet simulator: registration,
waiting for a kubelet that is not there yet, and re-registration after restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devplug.api.constants import KUBELET_SOCKET
from devplug.ground.unixserver import socket_identity
from devplug.simulator import Kubelet

FAKE = "test.devplug.io/fake"
BIG = "test.devplug.io/big"
CONFIG = f"""resources:
  - name: {FAKE}
    virtual: 3
    preferredAllocation: true
  - name: {BIG}
    virtual: 500
    count: 2
"""
RESTARTS = 20


@asynccontextmanager
async def daemon(tmp: Path, plugin_dir: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    config = tmp / "config.yaml"
    config.write_text(CONFIG)
    command = ["serve", "--config", str(config), "--plugin-dir", str(plugin_dir)]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "devplug.cli.main", *command)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0


def registration_ms(kubelet: Kubelet, resource: str, after: int) -> float:
    """From the moment kubelet.sock was created to the plugin's registration."""
    created = (kubelet.plugin_dir / KUBELET_SOCKET).stat().st_ctime_ns / 1e9
    event = [e for e in kubelet.events if e.kind == "registered" and e.resource == resource]
    return (event[after].time - created) * 1000


async def test_registers_once_devices_are_known(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "device-plugins"
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet,
        daemon(short_tmp, plugin_dir),
    ):
        fake = await kubelet.wait_for_resource(FAKE, count=3)
        big = await kubelet.wait_for_resource(BIG, count=1000)
        assert [d.id for d in fake.devices] == ["fake-0", "fake-1", "fake-2"]
        assert fake.preferred_allocation
        assert not fake.pre_start_required
        assert big.capacity == 1000
        registered = {e.resource: e.detail for e in kubelet.events if e.kind == "registered"}
        assert registered == {
            FAKE: "devplug-test.devplug.io-fake.sock",
            BIG: "devplug-test.devplug.io-big.sock",
        }
        # The device list arrived with (not after) the registration: nothing was
        # ever seen empty.
        lists: dict[str, list[str]] = {FAKE: [], BIG: []}
        for event in kubelet.events:
            if event.kind == "devices":
                lists[event.resource].append(event.detail)
        # Every list the kubelet saw was whole and healthy ("healthy/total healthy").
        assert lists == {FAKE: ["3/3 healthy"], BIG: ["1000/1000 healthy"]}


async def test_waits_for_a_kubelet_that_is_not_there_yet(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "device-plugins"
    plugin_dir.mkdir()
    async with daemon(short_tmp, plugin_dir) as proc:
        # The plugin serves first; no kubelet.sock yet, nothing to register with.
        sockets = {"devplug-test.devplug.io-fake.sock", "devplug-test.devplug.io-big.sock"}
        await wait_for_files(plugin_dir, sockets)
        assert proc.returncode is None
        async with Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet:
            # Kubelet start wipes the folder's sockets, then serves kubelet.sock.
            await kubelet.wait_for_resource(FAKE, count=3)
            await kubelet.wait_for_resource(BIG, count=1000)
            assert kubelet.registrations(FAKE) == 1


async def wait_for_files(folder: Path, names: set[str]) -> None:
    """Return once every name exists in `folder`, driven by inotify."""
    from asyncinotify import Inotify, Mask

    with Inotify() as inotify:
        inotify.add_watch(folder, Mask.CREATE | Mask.MOVED_TO)
        if names <= set(os.listdir(folder)):
            return
        async with asyncio.timeout(10):
            async for _ in inotify:
                if names <= set(os.listdir(folder)):
                    return


async def test_reregisters_after_every_kubelet_restart(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "device-plugins"
    times: list[float] = []
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet,
        daemon(short_tmp, plugin_dir) as proc,
    ):
        await kubelet.wait_for_resource(FAKE, count=3)
        await kubelet.wait_for_resource(BIG, count=1000)
        for round_ in range(1, RESTARTS + 1):
            await kubelet.restart()
            for resource, count in ((FAKE, 3), (BIG, 1000)):
                assert await kubelet.wait_for_registration(resource, after=round_) == round_ + 1
                status = await kubelet.wait_for_resource(resource, count=count)
                assert status.capacity == count  # allocatable right after re-registering
                times.append(registration_ms(kubelet, resource, round_))
        assert proc.returncode is None
    assert len(times) == 2 * RESTARTS
    print(f"re-registration: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")


async def test_reregisters_when_only_kubelet_sock_is_recreated(short_tmp: Path) -> None:
    """The kubelet.sock changes but our socket stays: register again anyway (Go plugins
    that only watch their own socket miss this)."""

    plugin_dir = short_tmp / "device-plugins"
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet,
        daemon(short_tmp, plugin_dir),
    ):
        await kubelet.wait_for_resource(FAKE, count=3)
        sock = plugin_dir / KUBELET_SOCKET
        aside = short_tmp / "kubelet.sock.aside"
        for round_ in range(1, 4):
            os.rename(sock, aside)
            os.rename(aside, sock)  # a new directory entry: a new kubelet.sock
            assert await kubelet.wait_for_registration(FAKE, after=round_) == round_ + 1


async def test_serves_again_when_its_socket_is_removed(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "device-plugins"
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet,
        daemon(short_tmp, plugin_dir),
    ):
        await kubelet.wait_for_resource(FAKE, count=3)
        (plugin_dir / "devplug-test.devplug.io-fake.sock").unlink()
        assert await kubelet.wait_for_registration(FAKE, after=1) == 2
        await kubelet.wait_for_resource(FAKE, count=3)
        assert kubelet.registrations(BIG) == 1  # the other resource was left alone


async def test_a_wipe_right_after_a_re_serve_costs_one_registration(short_tmp: Path) -> None:
    """The race of a real kubelet restart, made deterministic. The old kubelet is killed
    (its kubelet.sock stays behind), our sockets are removed and served again, devplug
    tries the dead kubelet.sock; only then does the new kubelet start: its wipe removes
    the sockets just served, then it serves a new kubelet.sock. A registration that
    waited on the dead socket would reach the new kubelet while our socket is missing
    (its dial back fails after the dial timeout) and be followed by a second one. One
    kubelet start must give exactly one registration per resource, none refused."""

    plugin_dir = short_tmp / "device-plugins"
    sockets = {"devplug-test.devplug.io-fake.sock", "devplug-test.devplug.io-big.sock"}
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False, dial_timeout=2) as kubelet,
        daemon(short_tmp, plugin_dir) as proc,
    ):
        await kubelet.wait_for_resource(FAKE, count=3)
        await kubelet.wait_for_resource(BIG, count=1000)
        before = dict(kubelet.node_status().registration_total)
        events = len(kubelet.events)

        async def between() -> None:
            for name in sockets:
                (plugin_dir / name).unlink()
            await wait_for_files(plugin_dir, sockets)  # served again
            await devplug_tries(plugin_dir / KUBELET_SOCKET)

        await kubelet.restart(kill=True, between=between)
        for resource, count in ((FAKE, 3), (BIG, 1000)):
            await kubelet.wait_for_registration(resource, after=1)
            assert (await kubelet.wait_for_resource(resource, count=count)).capacity == count
        total = kubelet.node_status().registration_total
        assert {r: total[r] - before[r] for r in (FAKE, BIG)} == {FAKE: 1, BIG: 1}
        kinds = [e.kind for e in kubelet.events[events:]]
        assert "registration_refused" not in kinds
        assert proc.returncode is None


async def devplug_tries(kubelet_socket: Path) -> None:
    """Serve kubelet.sock as a kubelet going down does: accept the first connection
    (so devplug is registering now) and drop it, then stop listening."""
    import socket

    os.unlink(kubelet_socket)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(kubelet_socket))
    listener.listen(8)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(10):
            connection, _ = await loop.sock_accept(listener)
        connection.close()
    finally:
        listener.close()


async def test_a_killed_kubelet_leaves_its_socket_until_the_next_wipes_it(short_tmp: Path) -> None:
    """The simulator's SIGKILL restart, as the real kubelet's: the old kubelet.sock
    stays, refusing connections, until the next kubelet's start-up wipe."""
    import socket

    plugin_dir = short_tmp / "device-plugins"
    async with (
        Kubelet(plugin_dir, short_tmp / "state", control_socket=False) as kubelet,
        daemon(short_tmp, plugin_dir),
    ):
        await kubelet.wait_for_resource(FAKE, count=3)
        sock = plugin_dir / KUBELET_SOCKET
        old = socket_identity(sock)
        seen: list[str] = []

        async def between() -> None:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(os.fspath(sock))
            except ConnectionRefusedError:
                seen.append("refused")
            finally:
                probe.close()

        await kubelet.restart(kill=True, between=between)
        assert seen == ["refused"]
        assert socket_identity(sock) not in (None, old)  # wiped, then served anew
        assert await kubelet.wait_for_registration(FAKE, after=1) == 2


@dataclass
class Registrations:
    """A registration server (a kubelet's Register) on `upstream`: what it was told."""

    upstream: Path
    registered: list[str] = field(default_factory=list)
    heard: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, resources: list[str], timeout: float) -> None:
        """Once `resources` registered (in any order)."""
        async with asyncio.timeout(timeout):
            while sorted(self.registered) != sorted(resources):
                self.heard.clear()
                await self.heard.wait()


@pytest.fixture
async def registrations(short_tmp: Path) -> AsyncIterator[Registrations]:
    from devplug.api.v1beta1 import api_pb2 as pb
    from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
    from devplug.ground.unixserver import UnixServer

    heard = Registrations(short_tmp / "registration.sock")

    class Registration(pb_grpc.RegistrationServicer):
        async def Register(self, request: pb.RegisterRequest, context: object) -> pb.Empty:
            heard.registered.append(request.resource_name)
            heard.heard.set()
            return pb.Empty()

    server = UnixServer(
        heard.upstream, lambda s: pb_grpc.add_RegistrationServicer_to_server(Registration(), s)
    )
    await server.start()
    yield heard
    await server.stop(0)


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(65536):
        dst.write(data)
        await dst.drain()
    dst.close()


async def test_a_kubelet_sock_changed_while_connecting_is_tried_again(
    short_tmp: Path, registrations: Registrations
) -> None:
    """kubelet.sock's inode changes while devplug connects, with no event for its name
    (here a chmod; a socket bound under a hidden name and linked into place does the
    same when its hidden name is removed). devplug sends nothing over that connection,
    and must try again at once rather than wait for an event that never comes."""
    plugin_dir = short_tmp / "device-plugins"
    plugin_dir.mkdir()
    kubelet_socket = plugin_dir / KUBELET_SOCKET
    connections = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # kubelet.sock forwards to the registration server; at the first connection
        # (devplug is connecting now) its inode changes, and no name event follows.
        nonlocal connections
        connections += 1
        if connections == 1:
            # ctime ticks coarsely: chmod until it shows (a few ms at most).
            created = kubelet_socket.lstat().st_ctime_ns
            while kubelet_socket.lstat().st_ctime_ns == created:
                os.chmod(kubelet_socket, 0o600)
                await asyncio.sleep(0)
        up_reader, up_writer = await asyncio.open_unix_connection(registrations.upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async with daemon(short_tmp, plugin_dir) as proc:
        sockets = {"devplug-test.devplug.io-fake.sock", "devplug-test.devplug.io-big.sock"}
        await wait_for_files(plugin_dir, sockets)
        relay_server = await asyncio.start_unix_server(relay, path=os.fspath(kubelet_socket))
        try:
            await registrations.until([FAKE, BIG], timeout=10)
        finally:  # not wait_closed: devplug keeps its connection
            relay_server.close()
        # Every byte passed after the chmod: each Register came from a try started
        # over once the first was superseded (gRPC may reuse the connection).
        assert connections >= 1
        assert sorted(registrations.registered) == sorted([FAKE, BIG])  # once each
        assert proc.returncode is None


async def test_a_new_kubelet_sock_not_listening_yet_is_tried_again_soon(
    short_tmp: Path, registrations: Registrations
) -> None:
    """Under load a kubelet takes seconds to start: devplug tries the dead kubelet.sock
    meanwhile, and each try waits twice as long as the last. The next kubelet's socket
    may then be found bound but not listening yet, with no event to come when it is:
    its first failure must be tried again at the shortest wait, not after the waits the
    dead one grew (which once left a real kubelet without registrations for 30 s)."""
    import json

    plugin_dir = short_tmp / "device-plugins"
    plugin_dir.mkdir()
    kubelet_socket = plugin_dir / KUBELET_SOCKET
    config = short_tmp / "one.yaml"
    config.write_text(f"resources:\n  - name: {FAKE}\n    virtual: 1\n")
    dead_tries = 0
    tried = asyncio.Event()

    async def dead(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal dead_tries
        dead_tries += 1
        tried.set()
        writer.close()  # a kubelet gone: nothing answers

    new_tries = 0

    async def starting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal new_tries
        new_tries += 1
        if new_tries == 1:  # not listening yet, as far as the first try can tell
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_unix_connection(registrations.upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    old = await asyncio.start_unix_server(dead, path=os.fspath(kubelet_socket))
    command = ["serve", "--config", str(config), "--plugin-dir", str(plugin_dir)]
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "devplug.cli.main", *command, "--log-format", "json"],
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            while dead_tries < 6:  # the wait has grown to 1.28 s by now
                tried.clear()
                await tried.wait()
        old.close()
        os.unlink(kubelet_socket)
        new = await asyncio.start_unix_server(starting, path=os.fspath(kubelet_socket))
        try:
            await registrations.until([FAKE], timeout=30)
        finally:
            new.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        await proc.wait()
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    gone = [line for line in lines if line.get("event") == "kubelet_gone"]
    # One event per kubelet.sock found silent: the dead one, then the starting one, each
    # tried again first at the shortest wait.
    assert [event["retry_s"] for event in gone] == [0.02, 0.02]
    assert registrations.registered == [FAKE]
