"""`devplug demo` end to end: the story's facts, its output forms, and its clean-up."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from devplug.demo import run_demo
from devplug.demo.view import TextView, use_colour

DEMO = [sys.executable, "-m", "devplug.cli.main", "demo"]
RESOURCES = {
    "devplug.io/null": 4,
    "devplug.io/zero": 1,
    "devplug.io/fake": 8,
    "devplug.io/shared": 4,
}


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return subprocess.run(
        [*DEMO, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def by_kind(found: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in found if e["event"] == kind]


def one(found: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    [event] = by_kind(found, kind)
    return event


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_text_story() -> None:
    result = demo()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for heading in (
        "1. The kubelet starts and the device plugins register",
        "2. What the node can offer",
        "3. Pods ask for devices",
        "4. A pod goes away and gives its devices back",
        "5. The kubelet restarts; the plugins register again",
    ):
        assert heading in out
    assert "RESOURCE           PLUGIN SOCKET" in out
    assert "/dev/null -> /dev/null (rw)" in out
    assert "share-a and share-b share one device, shared-0" in out
    assert "rejected: UnexpectedAdmissionError" in out
    assert "devplug.io/null    4            2 -> 0  2 -> 4" in out
    assert "Done in " in out
    assert "\x1b[" not in out  # not a terminal: no colour
    assert result.stderr == ""  # the simulator's and the plugin's logs go to files


def test_json_facts() -> None:
    result = demo("--output", "json")
    assert result.returncode == 0, result.stderr
    found = events(result.stdout)
    assert found[0]["event"] == "begin"
    assert found[-1]["event"] == "summary"
    assert [e["number"] for e in by_kind(found, "step")] == [1, 2, 3, 4, 5]

    # 1. the four resources of the default config register, from a real process
    started = one(found, "plugin_started")
    assert started["command"][1:] == [
        "-m",
        "devplug.cli.main",
        "--log-level",
        "info",
        "serve",
        "--plugin-dir",
        started["plugin_dir"],
    ]
    registered = {e["resource"]: e for e in by_kind(found, "registered")}
    assert {r: e["devices"] for r, e in registered.items()} == RESOURCES
    for event in registered.values():
        assert event["socket"].endswith(".sock")
        assert event["healthy"] == event["devices"]
        assert event["ms"] > 0

    # 2. capacity and allocatable per resource
    node = {r["resource"]: r for r in one(found, "node")["resources"]}
    assert {r: (n["capacity"], n["allocatable"]) for r, n in node.items()} == {
        r: (n, n) for r, n in RESOURCES.items()
    }
    assert node["devplug.io/null"]["devices"] == [f"null::{k}" for k in range(4)]

    # 3. the pods: one that fits, two sharing a device, one refused
    pods = {e["pod"]: e for e in by_kind(found, "pod")}
    fits = pods["fits"]
    assert fits["admitted"]
    [container] = fits["containers"]
    assert len(container["devices"]["devplug.io/null"]) == 2
    options = container["options"]
    assert {"container_path": "/dev/null", "host_path": "/dev/null", "permissions": "rw"} in (
        options["devices"]
    )
    assert {"container_path": "/dev/full", "host_path": "/dev/full", "permissions": "r"} in (
        options["devices"]
    )
    envs = {kv["name"]: kv["value"] for kv in options["envs"]}
    assert envs["DEVPLUG_DEVPLUG_IO_NULL"] == ",".join(container["devices"]["devplug.io/null"])
    assert set(options) == {"devices", "mounts", "envs", "annotations", "cdi_devices"}

    shared = [
        pods[name]["containers"][0]["devices"]["devplug.io/shared"]
        for name in ("share-a", "share-b")
    ]
    [a], [b] = shared
    assert a != b
    assert a.split("::")[0] == b.split("::")[0]
    assert {a.split("::")[1], b.split("::")[1]} == {"0", "1"}
    sharing = one(found, "shared_device")
    assert sharing["same_device"]
    assert sharing["devices"] == [a.split("::")[0]]

    greedy = pods["greedy"]
    assert not greedy["admitted"]
    assert greedy["reason"] == "UnexpectedAdmissionError"
    assert "devplug.io/null. Requested: 3, Available: 2" in greedy["message"]

    # 4. deleting `fits` frees its devices
    deleted = one(found, "pod_deleted")
    assert deleted["pod"] == "default/fits"
    assert deleted["freed"] == container["devices"]
    rows = {r["resource"]: r for r in deleted["resources"]}
    null = rows["devplug.io/null"]
    assert (null["in_use_before"], null["in_use_after"]) == (2, 0)
    assert (null["free_before"], null["free_after"]) == (2, 4)
    assert null["allocatable"] == 4
    assert rows["devplug.io/shared"]["in_use_after"] == 2  # share-a and share-b still run

    # 5. after a kubelet restart every plugin registers again, timed
    restarted = one(found, "kubelet_restarted")
    assert "kubelet.sock" in restarted["sockets_before"]
    again = {e["resource"]: e for e in by_kind(found, "reregistered")}
    assert {r: e["devices"] for r, e in again.items()} == RESOURCES
    for event in again.values():
        assert 0 < event["ms"] < 10_000
    restored = one(found, "restored")
    assert restored["in_use_before"] == restored["in_use_after"]
    assert restored["in_use_after"]["devplug.io/shared"] == 2

    summary = found[-1]
    assert summary["ok"]
    assert summary["registered"] == summary["reregistered"] == 4
    assert (summary["admitted"], summary["rejected"], summary["freed"]) == (3, 1, 4)

    # nothing left behind
    assert not Path(found[0]["workdir"]).exists()
    assert not alive(started["pid"])


def test_keep_keeps_the_work_folder() -> None:
    result = demo("--keep", "-o", "json")
    assert result.returncode == 0, result.stderr
    found = events(result.stdout)
    workdir = Path(one(found, "kept")["workdir"])
    try:
        assert workdir == Path(found[0]["workdir"])
        assert (workdir / "plugin.log").read_text()
        assert "kubelet simulator serving" in (workdir / "kubelet.log").read_text()
        assert (workdir / "kubelet_internal_checkpoint").is_file()
        assert not alive(one(found, "plugin_started")["pid"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("output", ["text", "json"])
def test_plugin_that_dies_fails_the_demo(output: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    failing = ["/bin/sh", "-c", "echo 'no devices here' >&2; exit 3"]
    code = run_demo(output, plugin_command=failing, stream=out, errors=err)
    assert code == 1
    assert "the plugin process exited with status 3" in err.getvalue()
    if output == "text":
        assert "no devices here" in err.getvalue()
        workdir = out.getvalue().splitlines()[1].split()[2]
    else:
        found = events(out.getvalue())
        error = one(found, "error")
        assert (error["plugin_exit_code"], error["plugin_stderr"]) == (3, "no devices here\n")
        assert "summary" not in {e["event"] for e in found}
        workdir = found[0]["workdir"]
    assert not Path(workdir).exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_and_cleans_up(signum: signal.Signals) -> None:
    # A plugin that never registers keeps the demo waiting, so the signal lands mid-way.
    code = (
        "import sys; from devplug.demo import run_demo; "
        "sys.exit(run_demo('json', plugin_command=[sys.executable, '-c', "
        "'import time; time.sleep(60)']))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        found = []
        for line in proc.stdout:
            found.append(json.loads(line))
            if found[-1]["event"] == "plugin_started":
                break
        started = one(found, "plugin_started")
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum.value, stderr
    assert events(stdout)[-1] == {"event": "interrupted", "signal": signum.name}
    assert f"stopped by {signum.name}" in stderr
    assert not alive(started["pid"])
    assert not Path(found[0]["workdir"]).exists()


def test_colour_only_on_a_terminal_without_no_color() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert use_colour(Terminal(), {})
    assert not use_colour(Terminal(), {"NO_COLOR": "1"})
    assert not use_colour(io.StringIO(), {})

    out = io.StringIO()
    view = TextView(out, io.StringIO(), colour=True)
    view.emit({"event": "step", "number": 1, "title": "Start", "text": "Why."})
    assert "\x1b[1m" in out.getvalue()
    assert "\x1b[" not in _plain_step()


def _plain_step() -> str:
    out = io.StringIO()
    TextView(out, io.StringIO()).emit({"event": "step", "number": 1, "title": "T", "text": "W"})
    return out.getvalue()
