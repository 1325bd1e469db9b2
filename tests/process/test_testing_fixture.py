"""The `kubelet` pytest fixture (devplug.testing): the guide's example run as written,
and each part of the harness: starting plugins, waiting, devices, admission,
rejection, deletion, restarts, options, failures and cleanup."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from sim_helpers import PLUGIN_SCRIPT, device, plugin, pod

from devplug import Device, DeviceNode, Mount, Plugin
from devplug.testing import KubeletHarness, PluginExited, pod_manifest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
GADGET = "example.com/gadget"
GIZMO = "example.com/gizmo"


class Gadgets(Plugin):
    """Four gadgets, two per NUMA node; gadget3 is unhealthy. Each brings all kinds of
    container edits."""

    resource_name = GADGET

    async def scan(self) -> None:
        self.publish(
            Device(
                f"gadget{i}",
                healthy=i != 3,
                numa_nodes=[i // 2],
                nodes=[DeviceNode("/dev/null", f"/dev/gadget{i}", "r")],
                mounts=[Mount("/etc/hostname", f"/gadget/{i}", read_only=True)],
                env={"GADGETS": str(i)},
                annotations={"gadget.example.com/id": str(i)},
                cdi_devices=[f"example.com/gadget=g{i}"],
            )
            for i in range(4)
        )


class Broken(Plugin):
    resource_name = "example.com/broken"

    async def scan(self) -> None:
        raise RuntimeError("no gadget found on the bus")


def doc_files() -> dict[str, str]:
    blocks = re.findall(r'```python title="([^"]+)"\n(.*?)```', DOCS.read_text(), re.S)
    return dict(blocks)


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=60, env=env)


# -- the guide ---------------------------------------------------------------------------


def test_entry_point_registers_the_plugin() -> None:
    [entry] = [e for e in entry_points(group="pytest11") if e.name == "devplug"]
    assert entry.value == "devplug.testing.pytest_plugin"


def test_the_guide_example_passes(tmp_path: Path) -> None:
    files = doc_files()
    assert set(files) == {"widgets.py", "test_widgets.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = len(re.findall(r"^def test_", files["test_widgets.py"], re.M))
    assert f"{tests} passed" in result.stdout, result.stdout


def test_a_failure_shows_the_plugin_output(tmp_path: Path) -> None:
    (tmp_path / "gadgets.py").write_text(
        "from devplug import Device, Plugin\n\n"
        "class Gadgets(Plugin):\n"
        "    resource_name = 'example.com/gadget'\n\n"
        "    async def scan(self):\n"
        "        print('gadget scan ran', flush=True)\n"
        "        self.publish([Device('g0')])\n"
    )
    (tmp_path / "test_fails.py").write_text(
        "from gadgets import Gadgets\n\n"
        "def test_fails(kubelet):\n"
        "    kubelet.start_plugin(Gadgets())\n"
        "    assert kubelet.device_ids('example.com/gadget') == ['g1']\n"
    )
    result = run_pytest(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "devplug plugin processes (call)" in result.stdout
    assert "gadget scan ran" in result.stdout


# -- starting plugins and reading devices ----------------------------------------------------


def test_start_plugin_returns_once_registered(kubelet: KubeletHarness) -> None:
    process = kubelet.start_plugin(Gadgets())
    assert process.running
    assert process.resources == (GADGET,)
    status = kubelet.resource(GADGET)
    assert status is not None
    assert (status.endpoint, status.listed) == ("connected", True)
    assert (status.capacity, status.allocatable, status.allocated) == (4, 3, 0)
    assert kubelet.device_ids(GADGET) == ["gadget0", "gadget1", "gadget2", "gadget3"]
    assert kubelet.device_ids(GADGET, healthy=False) == ["gadget3"]
    assert [d.numa_nodes for d in kubelet.devices(GADGET)] == [[0], [0], [1], [1]]
    assert kubelet.registrations(GADGET) == 1
    assert kubelet.resource("example.com/none") is None
    assert kubelet.devices("example.com/none") == []
    assert kubelet.plugin_dir.parent == kubelet.root
    assert (kubelet.plugin_dir / "kubelet.sock").exists()


def test_plugins_by_reference_script_module_and_config(
    kubelet: KubeletHarness, tmp_path: Path
) -> None:
    # "file.py:attribute", a function returning plugins
    (tmp_path / "gizmos.py").write_text(
        "from devplug import Device, Plugin\n\n"
        "def make():\n"
        "    return [Plugin('example.com/gizmo', [Device('z0'), Device('z1')])]\n"
    )
    kubelet.start_plugin(f"{tmp_path / 'gizmos.py'}:make")
    assert kubelet.device_ids(GIZMO) == ["z0", "z1"]

    # the plugin's own program, finding the plugin folder in $PLUGIN_DIR
    script = tmp_path / "program.py"
    script.write_text(
        "import os\nfrom devplug import Device, Plugin, run\n"
        "run(Plugin('example.com/prog', [Device('p0')]), plugin_dir=os.environ['PLUGIN_DIR'])\n"
    )
    kubelet.start_script(script, wait_for="example.com/prog")
    assert kubelet.device_ids("example.com/prog") == ["p0"]

    # python -m MODULE: the simulator tests' plugin program, with its spec file
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "plugin_dir": str(kubelet.plugin_dir),
                "plugins": [plugin("example.com/sim", [device("s0", [0])])],
            }
        )
    )
    (tmp_path / "sim_plugin.py").write_text(PLUGIN_SCRIPT)
    kubelet.start_module("sim_plugin", str(spec), cwd=tmp_path, wait_for=["example.com/sim"])
    assert kubelet.device_ids("example.com/sim") == ["s0"]

    # devplug serve with a config given as a dict
    kubelet.start_serve({"resources": [{"name": "example.com/virt", "virtual": 3}]})
    assert kubelet.device_ids("example.com/virt") == ["virt-0", "virt-1", "virt-2"]
    assert len(kubelet.processes) == 4
    assert kubelet.node().registrations == {
        GIZMO: 1,
        "example.com/prog": 1,
        "example.com/sim": 1,
        "example.com/virt": 1,
    }


def test_health_changes_are_waited_for(kubelet: KubeletHarness, tmp_path: Path) -> None:
    nodes = [tmp_path / "w0", tmp_path / "w1"]
    for node in nodes:
        node.touch()
    config = {
        "resources": [
            {
                "name": "example.com/w",
                "allowAnyPath": True,
                "groups": [{"paths": [{"path": str(tmp_path / "w*")}]}],
            }
        ]
    }
    kubelet.start_serve(config)
    ids = kubelet.device_ids("example.com/w")
    assert len(ids) == 2
    seq = kubelet.last_event_seq
    nodes[1].unlink()
    kubelet.wait_until(lambda: kubelet.device_ids("example.com/w", healthy=False) == [ids[1]])
    assert kubelet.wait_for_event("devices", resource="example.com/w", after=seq).seq > seq
    nodes[1].touch()
    assert kubelet.wait_for_resource("example.com/w", count=2).allocatable == 2


# -- pods ----------------------------------------------------------------------------------


def test_admission_results(kubelet: KubeletHarness) -> None:
    kubelet.start_plugin(Gadgets())
    first = kubelet.admit({GADGET: 1})
    assert first.admitted, first
    assert (first.name, first.namespace, first.reason) == ("pod-1", "default", "")
    assert first.devices() == {GADGET: ["gadget0"]}
    assert first.device_nodes() == {"/dev/gadget0": "/dev/null"}
    assert first.options().devices[0].permissions == "r"
    assert first.mounts() == {"/gadget/0": "/etc/hostname"}
    assert first.options().mounts[0].read_only
    assert first.env() == {"GADGETS": "0"}
    assert first.annotations() == {"gadget.example.com/id": "0"}
    assert first.cdi_devices() == ["example.com/gadget=g0"]
    assert first.container().state == "Started"
    assert "pod default/pod-1" in str(first)

    manifest = pod_manifest(
        "two", {"a": {GADGET: 1}, "b": {GADGET: 1}}, init_containers={"init": {GADGET: 1}}
    )
    two = kubelet.admit(manifest, namespace="team")
    assert two.admitted, two
    assert [c.name for c in two.containers] == ["init", "a", "b"]
    assert two.devices("init") == {GADGET: ["gadget1"]}
    assert two.devices("a") == {GADGET: ["gadget1"]}  # reused from the init container
    assert two.env("b") == {"GADGETS": "2"}
    with pytest.raises(ValueError, match="name one"):
        two.devices()
    with pytest.raises(KeyError):
        two.container("nope")

    results = kubelet.apply([pod("yaml-a", {"c": {}}), pod("yaml-b", {"c": {}})])
    assert [r.admitted for r in results] == [True, True]
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: from-yaml}\nspec:\n  containers: [{name: c}]\n"
    )
    assert kubelet.admit(text).name == "from-yaml"
    assert {p.name for p in kubelet.pods()} == {"pod-1", "two", "yaml-a", "yaml-b", "from-yaml"}


def test_rejection_and_deletion(kubelet: KubeletHarness) -> None:
    kubelet.start_plugin(Gadgets())
    too_many = kubelet.admit({GADGET: 4}, name="too-many")
    assert not too_many.admitted
    assert too_many.reason == "UnexpectedAdmissionError"
    assert "Requested: 4, Available: 3" in too_many.message
    assert too_many.containers == []
    with pytest.raises(ValueError, match="rejected"):
        too_many.devices()

    invalid = kubelet.admit(pod("bad", {"c": {GADGET: 1}}, requests={"c": {GADGET: 2}}))
    assert (invalid.admitted, invalid.reason) == (False, "Invalid")

    full = kubelet.admit({GADGET: 3}, name="full")
    assert full.admitted, full
    assert kubelet.resource(GADGET).allocated == 3  # type: ignore[union-attr]
    assert not kubelet.admit({GADGET: 1}).admitted
    assert kubelet.delete(full)
    assert not kubelet.delete("full")
    assert kubelet.resource(GADGET).allocated == 0  # type: ignore[union-attr]
    assert kubelet.admit({GADGET: 1}).admitted


# -- restarts, stops, failures ----------------------------------------------------------------


def test_restart_and_reregistration(kubelet: KubeletHarness) -> None:
    process = kubelet.start_plugin(Gadgets())
    held = kubelet.admit({GADGET: 2}, name="held")
    assert kubelet.restart() == {GADGET: 2}
    # As after a SIGKILL too: the old kubelet.sock stays until the new kubelet's wipe.
    assert kubelet.restart(kill=True) == {GADGET: 3}
    status = kubelet.resource(GADGET)
    assert status is not None
    assert (status.endpoint, status.allocatable, status.allocated) == ("connected", 3, 2)
    assert [p.name for p in kubelet.pods()] == ["held"]
    assert [e.kind for e in kubelet.events()].count("restarted") == 2
    assert not kubelet.admit({GADGET: 2}).admitted  # only gadget2 is left
    assert kubelet.delete(held)

    # A plugin that stops: the kubelet keeps its devices, unhealthy, for the grace period.
    seq = kubelet.last_event_seq
    assert process.stop() == 0
    kubelet.wait_for_event("endpoint_stopped", resource=GADGET, after=seq)
    status = kubelet.resource(GADGET)
    assert status is not None
    assert (status.endpoint, status.capacity, status.allocatable) == ("stopped", 4, 0)
    # ... and takes a new process of it back.
    seen = kubelet.registrations(GADGET)
    kubelet.start_plugin(Gadgets())
    assert kubelet.wait_for_registration(GADGET, after=seen) == seen + 1
    assert kubelet.restart(wait_for=[]) == {}


def test_a_plugin_that_exits_fails_the_wait_at_once(kubelet: KubeletHarness) -> None:
    with pytest.raises(PluginExited, match="no gadget found on the bus") as error:
        kubelet.start_plugin(Broken(), timeout=60)
    assert "exited with status 1" in str(error.value)
    [process] = kubelet.processes
    assert process.returncode == 1
    assert "Traceback" in kubelet.plugin_outputs()


def test_a_local_class_is_refused_with_a_hint(kubelet: KubeletHarness) -> None:
    class Local(Plugin):
        resource_name = "example.com/local"

    with pytest.raises(ValueError, match="top level of an importable module"):
        kubelet.start_plugin(Local(devices=[Device("l0")]))


def test_timeout_names_what_it_waited_for(kubelet: KubeletHarness) -> None:
    with pytest.raises(TimeoutError, match=r"resource example\.com/never"):
        kubelet.wait_for_resource("example.com/never", timeout=0.05)


@pytest.mark.timeout(120)
def test_a_wait_on_a_process_s_output_wakes_on_its_log(kubelet: KubeletHarness) -> None:
    """A line logged with no kubelet event after it ends the wait at once: woken only by
    events, the wait would sleep to its far deadline and the test's own limit would end
    it first."""
    script = "sleep 0.2; echo said-it; exec sleep 600"
    talker = kubelet.start_command(["sh", "-c", script], name="talker")
    kubelet.wait_until(lambda: "said-it" in talker.output, timeout=900, what="the line")
    assert talker.running


# -- options --------------------------------------------------------------------------------


@pytest.mark.kubelet(topology_policy="single-numa-node", numa_nodes=2)
def test_topology_policy_from_the_marker(kubelet: KubeletHarness) -> None:
    node = kubelet.node()
    assert (node.topology_policy, node.numa_nodes) == ("single-numa-node", [0, 1])
    kubelet.start_plugin(Gadgets())
    both = kubelet.admit({GADGET: 2})
    assert both.devices() == {GADGET: ["gadget0", "gadget1"]}  # NUMA node 0
    split = kubelet.admit({GADGET: 2})  # gadget2 is the only healthy one left on node 1
    assert (split.admitted, split.reason) == (False, "TopologyAffinityError")


@pytest.mark.parametrize(
    "kubelet",
    ["restricted", {"topology_policy": "best-effort", "numa_nodes": 3}],
    indirect=True,
)
def test_options_by_indirect_parametrisation(kubelet: KubeletHarness) -> None:
    node = kubelet.node()
    assert node.topology_policy in ("restricted", "best-effort")
    if node.topology_policy == "best-effort":
        assert node.numa_nodes == [0, 1, 2]


def test_factory_makes_independent_nodes(kubelet_factory) -> None:  # type: ignore[no-untyped-def]
    one = kubelet_factory()
    two = kubelet_factory(topology_policy="restricted")
    assert one.root != two.root
    assert (one.topology_policy, two.topology_policy) == ("none", "restricted")
    one.start_plugin(Gadgets())
    assert two.resource(GADGET) is None
    with pytest.raises(pytest.UsageError, match="unknown kubelet option"):
        kubelet_factory(colour="red")


def test_harness_without_pytest_cleans_up() -> None:
    with KubeletHarness(numa_nodes=2) as kubelet:
        process = kubelet.start_plugin(Gadgets())
        root, pid = kubelet.root, process.pid
        assert root.is_dir()
    assert not root.exists()
    assert process.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
