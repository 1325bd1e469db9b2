"""One door for device plugins and DRA drivers: `devplug.run` serves both from one
process, over real sockets, to the kubelet simulator; the example of docs/framework.md
is the program served."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dra_helpers import NODE, NodeDirs, allocated_claim, claim_pod, kubelet_for
from tests.sim_helpers import pod, stop_process

ROOT = Path(__file__).resolve().parents[2]
GADGET = "example.com/gadget"
DRIVER = "widget.example.com"

# The doc's classes, served by the doc's own `run` line with this node's folders added.
PROGRAM = """
import sys
from pathlib import Path

from devplug import DraSettings, run

example, plugin_dir, registry, plugins, cdi, claims, node = sys.argv[1:]
namespace = {"__name__": "example"}
exec(compile(Path(example).read_text(), "docs/framework.md", "exec"), namespace)
settings = DraSettings(
    node_name=node,
    registry_dir=Path(registry),
    plugins_dir=Path(plugins),
    cdi_dir=Path(cdi),
    claims_dir=Path(claims),
)
run(namespace["Gadgets"](), drivers=[namespace["Widgets"]()], plugin_dir=plugin_dir, dra=settings)
"""


def doc_example() -> str:
    text = (ROOT / "docs" / "framework.md").read_text()
    [block] = [
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "drivers=[Widgets()]" in b
    ]
    return block


def serve_example(dirs: NodeDirs) -> subprocess.Popen[str]:
    example = dirs.root / "example.py"
    example.write_text(doc_example())
    folders = [dirs.plugin_dir, dirs.registry, dirs.plugins, dirs.cdi, dirs.claims]
    return subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(example), *map(str, folders), NODE],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def widget_claim(dirs: NodeDirs) -> None:
    claim: dict[str, Any] = allocated_claim("wc", "uid-w", ["w1"])
    for result in claim["status"]["allocation"]["devices"]["results"]:
        result["driver"] = DRIVER
    dirs.claims.mkdir(parents=True)
    (dirs.claims / "wc.yaml").write_text(yaml.safe_dump(claim))


async def test_one_run_serves_a_device_plugin_and_a_dra_driver_to_the_kubelet(
    short_tmp: Path, daemons: list[Any]
) -> None:
    dirs = NodeDirs(short_tmp)
    widget_claim(dirs)
    daemons.append(proc := serve_example(dirs))

    async with kubelet_for(dirs) as kubelet:
        await kubelet.wait_for_resource(GADGET, count=4)
        await kubelet.wait_for_registration(DRIVER)
        [counted] = await kubelet.apply(pod("counted", {"app": {GADGET: 2}}))
        assert counted.admitted, counted.message
        ids = counted.containers[0].devices[GADGET]
        envs = {e.name: e.value for e in counted.containers[0].options.envs}
        assert envs["GADGETS"] == ",".join(ids)
        [described] = await kubelet.apply(claim_pod("described", "wc"))
        assert described.admitted, described.message
        assert described.containers[0].options.cdi_devices == [f"{DRIVER}/claim=uid-w-w1"]
        spec = json.loads((dirs.cdi / f"{DRIVER}-uid-w.json").read_text())
        assert "WIDGET_CLAIM=default/wc" in spec["containerEdits"]["env"]
        assert await kubelet.delete_pod("described")
        assert not (dirs.cdi / f"{DRIVER}-uid-w.json").exists()

    code = stop_process(proc)
    output = proc.stdout.read() if proc.stdout else ""
    assert code == 0, output
    assert not (dirs.plugin_dir / "devplug-example.com-gadget.sock").exists()
    assert "Traceback" not in output


def test_the_dra_modules_load_only_when_a_driver_is_served() -> None:
    """A device-plugin-only program stays lean: the door's names, `run` included, do
    not pull in the DRA node plugin, the slice publisher or the Kubernetes client."""
    code = (
        "import sys\n"
        "from devplug import Device, DeviceNode, Plugin, run, serve\n"
        "assert not [m for m in sys.modules if m.startswith(('devplug.framework.dra', "
        "'kubernetes'))]\n"
        "from devplug import DraDriver\n"
        "assert 'devplug.framework.dra.driver' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Serves one device and, in its Allocate answer, names the modules of LATER loaded by then.
PROBE = """
import sys
from devplug import Device, Plugin, run

LATER = sys.argv[2:]

class Probe(Plugin):
    resource_name = "example.com/probe"

    async def allocate(self, devices):
        edits = await super().allocate(devices)
        edits.env["LOADED"] = " ".join(m for m in LATER if m in sys.modules) or "none"
        return edits

run(Probe(devices=[Device("p0")]), plugin_dir=sys.argv[1])
"""


@pytest.fixture
def probe(short_tmp: Path, daemons: list[Any]) -> subprocess.Popen[str]:
    """PROBE serving in the plugin folder of a node in `short_tmp`."""
    later = ["pathlib", "urllib.parse", "ipaddress"]
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(NodeDirs(short_tmp).plugin_dir), *later],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    daemons.append(proc)
    return proc


async def test_a_device_plugin_registers_and_allocates_without_loading_pathlib(
    short_tmp: Path, probe: subprocess.Popen[str]
) -> None:
    """The door's device-plugin path holds its paths as str: pathlib, and the
    urllib.parse and ipaddress it imports, stay out of a plugin's memory and start."""
    async with kubelet_for(NodeDirs(short_tmp)) as kubelet:
        await kubelet.wait_for_resource("example.com/probe", count=1)
        [probed] = await kubelet.apply(pod("probed", {"app": {"example.com/probe": 1}}))
        assert probed.admitted, probed.message
        envs = {e.name: e.value for e in probed.containers[0].options.envs}

    code = stop_process(probe)
    output = probe.stdout.read() if probe.stdout else ""
    assert code == 0, output
    assert envs["LOADED"] == "none", envs
