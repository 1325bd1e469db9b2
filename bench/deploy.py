"""What a node pays for devplug as deployed: the image's size, the daemon's memory with
metrics on, and the time to scrape /metrics."""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import percentiles, rss_mib, serve_command

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT / "build" / "devplug-image.tar"
SCRAPES = 200
DEVICES = 64


def image_size() -> dict[str, Any]:
    """The OCI archive `make image` wrote, and the image's size as buildah stores it."""
    if not ARCHIVE.exists():
        return {"built": False}
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    name = f"localhost/devplug:{version.group(1) if version else ''}"
    # By the ID `make image` built (the name may be another checkout's build in this store).
    built = ROOT / "build" / "image.id"
    image = built.read_text().strip() if built.exists() else name
    stored = subprocess.run(
        ["buildah", "images", "--format", "{{.Size}}", image], capture_output=True, text=True
    )
    return {
        "built": True,
        "name": name,
        "archive_mib": round(ARCHIVE.stat().st_size / 2**20, 1),
        "size": stored.stdout.strip() if stored.returncode == 0 else None,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def metrics_cost() -> dict[str, Any]:
    """`devplug serve --metrics-port`: RSS once serving, /metrics scrape times, RSS after."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-metrics-") as tmp:
        config = Path(tmp) / "metrics.yaml"
        config.write_text(f"resources:\n  - name: bench.devplug.io/m\n    virtual: {DEVICES}\n")
        plugin_dir = Path(tmp) / "plugins"
        command = serve_command(config, plugin_dir, "--metrics-port", str(port), log_level=None)
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # blocks until the server says it serves
                if "serving /metrics" in line:
                    break
            else:
                raise RuntimeError("devplug serve --metrics-port ended before serving")
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                size = len(answer.read())
            rss_serving = rss_mib(proc.pid)
            samples = []
            for _ in range(SCRAPES):
                started = time.perf_counter()
                with urllib.request.urlopen(url, timeout=5) as answer:
                    answer.read()
                samples.append(time.perf_counter() - started)
            rss_after = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    scrape = percentiles(samples)
    return {
        "rss_metrics_on_mib": rss_serving,
        "rss_after_scrapes_mib": rss_after,
        "scrape": {
            "p50_ms": scrape["p50_ms"],
            "p99_ms": scrape["p99_ms"],
            "n": SCRAPES,
            "bytes": size,
        },
        "devices": DEVICES,
    }


def bench_deploy() -> dict[str, Any]:
    return {"image": image_size(), "metrics": metrics_cost()}
