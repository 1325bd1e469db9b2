"""Fault scenarios: the real `devplug serve` process against the kubelet simulator.

Each scenario takes an iteration count and returns an `Outcome` (failures, leaks,
wall time); tests/process/test_faults.py runs short versions and asserts a clean outcome,
tests/soak.py (`make soak`) long ones and prints the table. Nothing waits for a
fixed time: every wait is for an event (a registration, a device list, a file, a
log line), and the "random moments" of the faults are chosen by counting events.

What they run on is in tests/fault_harness.py; the folder scenarios (4) are in
tests/fault_folder.py, the slow or stuck kubelet (5) in tests/fault_kubelet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from fault_folder import folder_trouble
from fault_harness import (
    NODE,
    NULL_DEV,
    VIRT,
    WAIT_S,
    ListWatcher,
    Outcome,
    Serve,
    Snapshot,
    allocate_request,
    held,
    make_nodes,
    new_kubelet,
    node_config,
    pod,
    restore,
    serving,
    toggle,
    virt_config,
)
from fault_kubelet import hanging_register, stalled_reader

from devplug.api.constants import KUBELET_SOCKET
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.plugin import default_socket_name
from devplug.ground.channel import unix_channel
from devplug.simulator.results import REASON_UNEXPECTED_ADMISSION

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
