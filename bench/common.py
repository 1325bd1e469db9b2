"""What every benchmark shares: a real `devplug serve` process, a Device Plugin client
on its socket, timing, percentiles and the daemon's memory and CPU from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import FAST_RECONNECT


def percentiles(samples: list[float]) -> dict[str, float]:
    """Seconds in, milliseconds out: p50, p99, max and the count."""
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": pick(1.0), "n": len(ordered)}


def timed_calls(call: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_mib(pid: int) -> float:
    return round(proc_status(pid, "VmRSS") / 1024, 1)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> float:
    """The CPU time the process's live threads have used, to the nanosecond (from
    schedstat; /proc/PID/stat counts in 10 ms ticks, as much as a plugin's whole start
    costs). A thread that has ended is not counted: for processes whose threads live as
    long as they do, as the plugins of bench/floor.py."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as stats:
            total += int(stats.read().split()[0])
    return total / 1e9


def own_cpu() -> float:
    """User and system CPU time this process has used."""
    times = os.times()
    return times.user + times.system


def pids_with(pattern: str) -> list[int]:
    """The processes whose command line contains `pattern`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pattern in line:
            found.append(int(entry.name))
    return found


def cpu_of(pids: list[int]) -> float:
    """The CPU time of the processes still there."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue
    return total


def machine_cpu() -> tuple[int, int]:
    """The machine's busy and total CPU ticks since boot (the `cpu` line of /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])  # without guest time, counted in user already
    return total - idle, total


def serve_command(
    config: Path | None, plugin_dir: Path, *flags: str, log_level: str | None = "warning"
) -> list[str]:
    """The argument list of `devplug serve` (`config` None: the packaged default)."""
    command = [sys.executable, "-m", "devplug.cli.main"]
    command += ["--log-level", log_level] if log_level else []
    command += ["serve", "--plugin-dir", str(plugin_dir)]
    command += ["--config", str(config)] if config is not None else []
    return [*command, *flags]


@contextmanager
def daemon(
    config: Path, plugin_dir: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`devplug serve` on `config`, logging warnings only; stopped with SIGTERM."""
    command = serve_command(config, plugin_dir)
    proc = subprocess.Popen(command, env=None if env is None else {**os.environ, **env})
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stub_for(plugin_dir: Path, resource: str) -> tuple[grpc.Channel, pb_grpc.DevicePluginStub]:
    """A client of the resource's socket, once the plugin answers."""
    socket = plugin_dir / ("devplug-" + resource.replace("/", "-") + ".sock")
    channel = grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT)
    stub = pb_grpc.DevicePluginStub(channel)
    stub.GetDevicePluginOptions(pb.Empty(), wait_for_ready=True, timeout=30)
    return channel, stub


def allocate_request(ids: list[str]) -> pb.AllocateRequest:
    """One container asking for `ids`."""
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


def wait_for_health(stream: Any, device: str, health: str) -> None:
    """Read ListAndWatch until `device` is listed with `health`."""
    for message in stream:
        if any(device == d.ID and d.health == health for d in message.devices):
            return
    raise RuntimeError("stream ended")
