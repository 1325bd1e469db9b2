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
