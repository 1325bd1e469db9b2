"""The node-reboot window: from `devplug serve` starting to each resource registered
with the kubelet (and its first device list received). A pod the kubelet admits
before that fails with UnexpectedAdmissionError, so this is the time that matters
after a reboot. Measured against the kubelet simulator, the packaged default config.
And the other end: from SIGTERM to the process gone (a rolling update waits on it).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from common import cpu_seconds, serve_command

STARTUP_RUNS = 10


def bench_startup(root: Path, runs: int = STARTUP_RUNS) -> dict[str, Any]:
    return asyncio.run(_startup(root, runs))


async def _startup(root: Path, runs: int) -> dict[str, Any]:
    from devplug.simulator import Kubelet

    # The simulator reports every daemon stop as a warning: not news here.
    logging.getLogger("devplug").setLevel(logging.ERROR)

    plugin_dir = root / "startup-plugins"
    registered: dict[str, list[float]] = {}
    listed: dict[str, list[float]] = {}
    cpu: list[float] = []
    stops: list[float] = []
    async with Kubelet(plugin_dir, root / "startup-state", control_socket=False) as kubelet:
        for _ in range(runs):
            after = kubelet.last_event_seq
            started = time.time()
            proc = await asyncio.create_subprocess_exec(*serve_command(None, plugin_dir))
            try:
                resources = await _all_listed(kubelet, after)
                cpu.append(cpu_seconds(proc.pid) * 1000)
            finally:
                stopping = time.perf_counter()
                proc.terminate()
                await proc.wait()
                stops.append((time.perf_counter() - stopping) * 1000)
            for event in kubelet.events:
                if event.seq <= after or event.resource not in resources:
                    continue
                ms = (event.time - started) * 1000
                if event.kind == "registered":
                    registered.setdefault(event.resource, []).append(ms)
                elif event.kind == "devices" and len(listed.get(event.resource, [])) < len(
                    registered.get(event.resource, [])
                ):
                    listed.setdefault(event.resource, []).append(ms)
    every = [max(times) for times in zip(*registered.values(), strict=True)]
    return {
        "runs": runs,
        "registered_ms": {r: _stats(t) for r, t in sorted(registered.items())},
        "first_list_ms": {r: _stats(t) for r, t in sorted(listed.items())},
        "all_registered_ms": _stats(every),
        # CPU the daemon used until then: the same work, whatever else the machine runs.
        "cpu_to_listed_ms": _stats(cpu),
        "sigterm_to_exit_ms": _stats(stops),
    }


async def _all_listed(kubelet: Any, after: int) -> set[str]:
    """Wait until every resource of the default config registered after `after` and
    sent its device list; their names."""
    from devplug.sources import load_default_config

    names = {r.name for r in load_default_config().resources}

    def done() -> bool:
        listed = {e.resource for e in kubelet.events if e.seq > after and e.kind == "devices"}
        return names <= listed

    await kubelet.wait_for(done, 60, "every resource listed")
    return names


def _stats(samples: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(samples), 1),
        "min": round(min(samples), 1),
        "max": round(max(samples), 1),
    }


if __name__ == "__main__":
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dp-startup-") as tmp:
        print(json.dumps(bench_startup(Path(tmp)), indent=2))
