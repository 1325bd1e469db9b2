"""devplug's framework beside the Python floor: the same device plugin written on
`devplug.run` (bench/framework_plugin.py) and straight on grpc.aio (bench/bare.py),
each started RUNS times, interleaved, against the kubelet simulator.

Per run and side: start to registered (process spawned to the kubelet's Register
received) and the CPU the plugin used until then, Allocate latency (sequential, one
grpcio client) and the plugin's CPU per call, Allocate throughput (8 clients at once,
one channel each) and the CPU per call under it, and RSS after the load. Both sides run
at once and are measured side by side: each is started first in every other run,
sequential calls alternate between them, and the 8-client bursts take turns, each side
first in every other round (the side that goes second shares the machine with the
other's closing connections). The report gives each side's median over the runs and the framework's
ratio to the floor, the median of the runs' ratios.

Where the framework's time went, and what was done (callgrind's instruction counts for
the start, the CPU each process used per call for Allocate):

- Allocate: a timer the watchdog kept pending in the loop (its 0.25 s heartbeat) made
  every turn of the loop wait in the kernel with a timeout, ~3 % of an Allocate's CPU.
  The watchdog's thread now asks the loop for the heartbeat instead. The framework's
  default allocate hook no longer has its answer checked again on every call (it is
  built from Devices checked when made), and virtual devices merge nothing. What is
  left is the framework's checks of the request (IDs known, unique and healthy), ~3 us
  in-process against bare.py's ~6 us handler: 1-3 % of the CPU per call through gRPC.
- Start to registered is almost all imports, grpc, protobuf and asyncio on both sides
  (~100 ms of a ~125 ms start on a quiet machine). The framework's own imports were
  13 % more instructions than bare.py's whole start; 9 % now: its regular expressions
  are compiled on first use, and Event, Limits, DeviceNode and Mount are NamedTuples
  (a frozen dataclass costs ~0.6 ms to define, a NamedTuple ~0.12 ms). What is left:
  ctypes for inotify (~2 % of the start), Device and ContainerEdits (dataclasses, ~1.5
  %) and the framework's own ~25 modules. Earlier, pathlib (with urllib.parse and
  ipaddress) was dropped from the daemon's imports: the daemon holds paths as str.
- The machine's own swings are larger than what is left: one side's 8-client
  throughput ranges over 20 % across the runs of one bench, and a run's pair can differ
  by 10 % either way.
"""

from __future__ import annotations

import asyncio
import compileall
import functools
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from common import allocate_request, cpu_seconds, percentiles, rss_mib, timed_calls

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from devplug.simulator import Kubelet

RUNS = 8  # even: each side started first as often
DEVICES = 16
WARMUP_CALLS = 200
SEQUENTIAL_CALLS = 1000
CLIENTS = 8
CALLS_PER_CLIENT = 100
BURSTS = 4  # even: each side first as often
WARMUP_PER_CLIENT = 20
HERE = Path(__file__).resolve().parent
SIDES = {
    # side: (script, socket name of its resource)
    "bare_grpc_aio": ("bare.py", "bare-{}.sock"),
    "framework": ("framework_plugin.py", "devplug-{}.sock"),
}
TARGETS = {  # framework / bare
    "allocate_p50_ratio_max": 1.05,
    "concurrent_calls_per_s_ratio_min": 1.0,
    "start_to_registered_ratio_max": 1.1,
    "rss_extra_mib_max": 1.0,
}


def bench_floor(root: Path, runs: int = RUNS) -> dict[str, Any]:
    # Bytecode as an installed package has it (pip compiles at install; the image and
    # this environment set PYTHONDONTWRITEBYTECODE, which would compile every module
    # from source at each start and charge the larger side for it).
    compileall.compile_dir(HERE.parent / "src" / "devplug", quiet=1)
    return asyncio.run(_bench(root / "floor", runs))


async def _bench(root: Path, runs: int) -> dict[str, Any]:
    from devplug.simulator import Kubelet

    logging.getLogger("devplug").setLevel(logging.ERROR)  # every plugin stop is a warning
    plugin_dir = root / "plugins"
    found: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    async with Kubelet(plugin_dir, root / "state", control_socket=False) as kubelet:
        for run in range(runs + 1):  # the first run warms the caches and is not counted
            # Each side starts first in every other run: the one started second finds
            # the page cache warmer and the machine busier.
            order = list(SIDES) if run % 2 else list(reversed(SIDES))
            procs: dict[str, asyncio.subprocess.Process] = {}
            try:
                started: dict[str, dict[str, float]] = {}
                for side in order:
                    procs[side], started[side] = await _start(kubelet, plugin_dir, side)
                sockets = {
                    side: plugin_dir / SIDES[side][1].format(_resource(side).replace("/", "-"))
                    for side in order
                }
                pids = {side: proc.pid for side, proc in procs.items()}
                load = await asyncio.to_thread(_load, sockets, pids, order)
                if run == 0:
                    continue
                for side in order:
                    samples = found[side]
                    for key, value in {**started[side], **load[side]}.items():
                        samples.setdefault(key, []).append(value)
                    samples.setdefault("rss_mib", []).append(rss_mib(pids[side]))
            finally:
                for proc in procs.values():
                    proc.terminate()
                for proc in procs.values():
                    await proc.wait()
    medians = {
        side: {key: round(statistics.median(values), 3) for key, values in samples.items()}
        for side, samples in found.items()
    }
    bare, ours = found["bare_grpc_aio"], found["framework"]

    def ratio(key: str) -> float:
        """The median of the runs' ratios: each run's pair ran side by side, so a
        machine that slows down meanwhile slows both sides of a pair alike."""
        pairs = zip(ours[key], bare[key], strict=True)
        return round(statistics.median(o / b for o, b in pairs), 3)

    ratios = {
        "allocate_p50": ratio("allocate_p50_ms"),
        "allocate_cpu": ratio("allocate_cpu_us"),
        "concurrent_calls_per_s": ratio("concurrent_calls_per_s"),
        "start_to_registered": ratio("start_to_registered_ms"),
        "cpu_to_registered": ratio("cpu_to_registered_ms"),
        "rss_extra_mib": round(
            medians["framework"]["rss_mib"] - medians["bare_grpc_aio"]["rss_mib"], 1
        ),
    }
    return {
        "runs": runs,
        "devices": DEVICES,
        "clients": CLIENTS,
        "median": medians,
        "framework_vs_bare": ratios,
        "targets": TARGETS,
        "samples": found,
    }


def _resource(side: str) -> str:
    return f"bench.example/{side.replace('_', '-')}"


async def _start(
    kubelet: Kubelet, plugin_dir: Path, side: str
) -> tuple[asyncio.subprocess.Process, dict[str, float]]:
    """Start one side; the wall time from spawn to the kubelet's Register received,
    and the CPU the plugin used until then (the same work whatever else the machine
    runs, where wall times swing)."""
    resource = _resource(side)
    after = kubelet.last_event_seq
    started = time.time()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / SIDES[side][0]), str(plugin_dir), resource, str(DEVICES)
    )
    try:
        await kubelet.wait_for_resource(resource, count=DEVICES, timeout=60)
    except BaseException:
        proc.terminate()
        await proc.wait()
        raise
    [registered] = [
        e.time
        for e in kubelet.events
        if e.seq > after and e.kind == "registered" and e.resource == resource
    ]
    return proc, {
        "start_to_registered_ms": (registered - started) * 1000,
        "cpu_to_registered_ms": cpu_seconds(proc.pid) * 1000,
    }


def _load(sockets: dict[str, Path], pids: dict[str, int], order: list[str]) -> dict[str, Any]:
    """Allocate of two devices on both sides, interleaved so that whatever else the
    machine does falls on both alike: sequential calls alternating between the sides
    (p50, and each plugin's CPU per call over the block: it serves only its own), then
    bursts of CLIENTS clients at once, one side after the other, BURSTS times."""
    request = allocate_request(["dev-0", "dev-1"])

    def client(side: str) -> tuple[grpc.Channel, Callable[[], object]]:
        channel = grpc.insecure_channel(f"unix://{sockets[side]}")
        stub = pb_grpc.DevicePluginStub(channel)
        stub.GetDevicePluginOptions(pb.Empty(), wait_for_ready=True, timeout=30)
        return channel, lambda: stub.Allocate(request)

    result: dict[str, dict[str, float]] = {side: {} for side in order}
    channels, calls = zip(*(client(side) for side in order), strict=True)
    try:
        for call in calls:
            timed_calls(call, WARMUP_CALLS)
        cpu = {side: cpu_seconds(pids[side]) for side in order}
        times: list[list[float]] = [[] for _ in order]
        for _ in range(SEQUENTIAL_CALLS):
            for index, call in enumerate(calls):
                begun = time.perf_counter()
                call()
                times[index].append(time.perf_counter() - begun)
        for index, side in enumerate(order):
            used = cpu_seconds(pids[side]) - cpu[side]
            result[side]["allocate_p50_ms"] = percentiles(times[index])["p50_ms"]
            result[side]["allocate_cpu_us"] = round(used / SEQUENTIAL_CALLS * 1e6, 1)
    finally:
        for channel in channels:
            channel.close()
    elapsed = dict.fromkeys(order, 0.0)
    used = dict.fromkeys(order, 0.0)
    for burst in range(BURSTS):
        # Each side goes first in every other round: the side that goes second shares
        # the machine with the other's closing connections.
        for side in order if burst % 2 == 0 else order[::-1]:
            cpu_before = cpu_seconds(pids[side])
            elapsed[side] += _burst(functools.partial(client, side))
            used[side] += cpu_seconds(pids[side]) - cpu_before
    calls = BURSTS * CLIENTS * (CALLS_PER_CLIENT + WARMUP_PER_CLIENT)
    for side in order:
        result[side]["concurrent_calls_per_s"] = round(
            BURSTS * CLIENTS * CALLS_PER_CLIENT / elapsed[side]
        )
        result[side]["concurrent_cpu_us"] = round(used[side] / calls * 1e6, 1)
    return result


def _burst(client: Callable[[], tuple[grpc.Channel, Callable[[], object]]]) -> float:
    """CLIENTS clients, one channel each, CALLS_PER_CLIENT calls each, all at once:
    the seconds from the start signal to the last answer."""
    barrier = threading.Barrier(CLIENTS + 1)

    def hammer() -> None:
        channel, call = client()
        with channel:
            timed_calls(call, WARMUP_PER_CLIENT)
            barrier.wait()
            timed_calls(call, CALLS_PER_CLIENT)

    threads = [threading.Thread(target=hammer) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    begun = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - begun


def summary(report: dict[str, Any]) -> str:
    r = report["framework_vs_bare"]
    return (
        f"framework/bare grpc.aio: allocate p50 {r['allocate_p50']}x "
        f"(cpu {r['allocate_cpu']}x), 8 clients "
        f"{r['concurrent_calls_per_s']}x, start to registered {r['start_to_registered']}x "
        f"(cpu {r['cpu_to_registered']}x), "
        f"rss {r['rss_extra_mib']:+} MiB"
    )


if __name__ == "__main__":
    import json
    import tempfile

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with tempfile.TemporaryDirectory(prefix="dp-floor-") as tmp:
        report = bench_floor(Path(tmp), runs)
        if "--samples" not in sys.argv:
            report.pop("samples")
        print(json.dumps(report, indent=2))
        print(summary(report), file=sys.stderr)
