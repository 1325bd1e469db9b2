"""What `devplug serve` loads on its way to registration: after a node reboot every
millisecond before it registers can fail a pod's admission (bench/startup.py times it)."""

from __future__ import annotations

import json
from pathlib import Path

from fault_harness import WAIT_S, Serve, new_kubelet, serving

from devplug.sources import load_default_config

# Loaded by other commands, never needed to serve.
NOT_FOR_SERVE = {
    "devplug.cli.check",
    "devplug.cli.cluster",
    "devplug.cli.demo",
    "devplug.cli.kubelet",
    "devplug.simulator",
    "importlib.resources",
    "ssl",
    "hashlib",
    # Each loaded only when the config or a flag asks for what needs it.
    "pynvml",
    "pyudev",
    "prometheus_client",
    "kubernetes",
    "aiohttp",
    "devplug.apiserver.client",
    "jsonschema",
}


async def test_serve_loads_only_what_serving_needs(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "plugins"
    names = [r.name for r in load_default_config().resources]
    async with (
        new_kubelet(short_tmp, plugin_dir) as kubelet,
        serving(Serve(short_tmp, None, plugin_dir)) as serve,
    ):
        for name in names:
            await kubelet.wait_for_resource(name, timeout=WAIT_S)
        await serve.tasks()
        modules = set(json.loads(serve.state.read_text())["modules"])
    assert "devplug.framework.daemon" in modules  # the dump sees what serving loaded
    assert not modules & NOT_FOR_SERVE, sorted(modules & NOT_FOR_SERVE)
