"""devplug's framework beside the Python floor: the same device plugin written on
`devplug.run` (bench/framework_plugin.py) and straight on grpc.aio (bench/bare.py),
run side by side RUNS times against the kubelet simulator.

Per run and side: start to registered (process spawned to the kubelet's Register
received) and the CPU the plugin used until then, STARTS times; Allocate latency
(sequential, one grpcio client) and the plugin's CPU per call; Allocate throughput (8
clients at once, one channel each) and the CPU per call under it; RSS after the load.
Both sides are measured side by side: each is started first in every other run, the
starts take turns, sequential calls alternate between the sides, and the 8-client
bursts take turns, each side first in every other round (the side that goes second
shares the machine with the other's closing connections). CPU is read per thread from
schedstat, to the nanosecond. The report gives each side's median and the framework's
ratio to the floor, the median of the pairs' ratios.

Where the framework's time went, and what was done (callgrind's instruction counts, the
CPU each process used per call):

- Allocate: a timer the watchdog kept pending in the loop (its 0.25 s heartbeat) made
  every turn of the loop wait in the kernel with a timeout, ~3 % of an Allocate's CPU;
  the watchdog's thread now asks the loop for the heartbeat instead. In-process, the
  handler cost 19.6k instructions per call more than bare.py's (35k): the framework's
  default answer went through ContainerEdits and was checked again, the request's IDs
  were read by iterating protobuf's repeated fields (ten times the cost of indexing
  them), and a coroutine wrapped every handler to refuse undecodable requests. The
  default answer is now written straight into the response, the IDs are read once by
  index, and the servicer refuses an undecodable request itself: 1.3k instructions
  more than bare.py per call, for the checks that the IDs are known, unique and
  healthy and that the request is within its limits.
- Start to registered is almost all imports, grpc, protobuf and asyncio on both sides.
  The framework's own imports cost 35M instructions above bare.py's (of ~350M to
  registered), now 17M: Device and ContainerEdits are written out instead of
  dataclasses (defining them cost 9.7M, importing dataclasses 2.8M), and the folder
  watch (ctypes, 7M) is set up once an endpoint has made its first try, while the
  kubelet dials back, and then looks at the folder again. Earlier: regular expressions
  compiled on first use, NamedTuples for Event, Limits, DeviceNode and Mount, and the
  daemon's paths held as str (no pathlib). What is left is the framework's own ~23
  modules.
- The machine's own swings are larger than what is left: with 4 bursts per side and
  run, the ratio of one run's pair swung by 9 % (standard deviation) between two copies
  of the same plugin; with 16, by 2 %. Start to registered swings by ~10 % per pair.
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
from common import allocate_request, percentiles, rss_mib, thread_cpu_seconds, timed_calls

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from devplug.simulator import Kubelet

RUNS = 8  # even: each side started first as often
STARTS = 3  # per run and side, taking turns: the start is measured thrice as often
DEVICES = 16
WARMUP_CALLS = 200
SEQUENTIAL_CALLS = 1000
CLIENTS = 8
CALLS_PER_CLIENT = 100
BURSTS = 16  # even: each side first as often (4 were too few: see above)
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
                started: dict[str, dict[str, list[float]]] = {side: {} for side in order}
                for start in range(STARTS):
                    for side in order:
                        if side in procs:  # the last start of each side serves the load
                            procs[side].terminate()
                            await procs[side].wait()
                        procs[side], times = await _start(kubelet, plugin_dir, side, start)
                        for key, value in times.items():
                            started[side].setdefault(key, []).append(value)
                sockets = {
                    side: plugin_dir
                    / SIDES[side][1].format(_resource(side, STARTS - 1).replace("/", "-"))
                    for side in order
                }
                pids = {side: proc.pid for side, proc in procs.items()}
                load = await asyncio.to_thread(_load, sockets, pids, order)
                if run == 0:
                    continue
                for side in order:
                    samples = found[side]
                    for key, values in started[side].items():
                        samples.setdefault(key, []).extend(values)
                    for key, value in load[side].items():
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


def _resource(side: str, start: int = 0) -> str:
    return f"bench.example/{side.replace('_', '-')}{start or ''}"


async def _start(
    kubelet: Kubelet, plugin_dir: Path, side: str, start: int = 0
) -> tuple[asyncio.subprocess.Process, dict[str, float]]:
    """Start one side; the wall time from spawn to the kubelet's Register received,
    and the CPU the plugin used until then (the same work whatever else the machine
    runs, where wall times swing). Each start of a run serves a resource of its own:
    the kubelet keeps the last start's devices apart from the one before it."""
    resource = _resource(side, start)
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
        "cpu_to_registered_ms": thread_cpu_seconds(proc.pid) * 1000,
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
        cpu = {side: thread_cpu_seconds(pids[side]) for side in order}
        times: list[list[float]] = [[] for _ in order]
        for _ in range(SEQUENTIAL_CALLS):
            for index, call in enumerate(calls):
                begun = time.perf_counter()
                call()
                times[index].append(time.perf_counter() - begun)
        for index, side in enumerate(order):
            used = thread_cpu_seconds(pids[side]) - cpu[side]
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
            cpu_before = thread_cpu_seconds(pids[side])
            elapsed[side] += _burst(functools.partial(client, side))
            used[side] += thread_cpu_seconds(pids[side]) - cpu_before
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
