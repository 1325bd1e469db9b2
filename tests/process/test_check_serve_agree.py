"""`devplug check` says what `devplug serve` does: for each config, check's verdict (exit
status, its one line) and the devices it lists per resource are what a real `serve`
does against the kubelet simulator: refuses with the same line, or serves exactly
those devices, and a pod of each resource is admitted."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sim_helpers import devplug

from devplug.fakes.sysfs import make_node
from devplug.testing import KubeletHarness

LONG = "example.com/" + "x" * 63  # its socket path passes 107 bytes in any plugin folder


@dataclass(frozen=True)
class Case:
    config: Callable[[Path], dict[str, object]]
    # What check says: 0 and the resources' device counts, or 2 and a piece of its line.
    exit: int
    counts: dict[str, int] | None = None
    problem: str = ""


def virtual(name: str, n: int, **more: object) -> dict[str, object]:
    return {"name": name, "virtual": n, **more}


def nodes(tmp: Path, n: int) -> str:
    """`n` device nodes in a folder of their own; the glob that matches them."""
    folder = tmp / "dev"
    folder.mkdir(exist_ok=True)
    for i in range(n):
        make_node(folder / f"acc{i}")
    return str(folder / "acc*")


def glob_resource(tmp: Path, n: int, **group: object) -> dict[str, object]:
    return {
        "name": "example.com/acc",
        "allowAnyPath": True,
        "groups": [{"paths": [{"path": nodes(tmp, n)}], **group}],
    }


CASES = {
    # More devices than one request may carry IDs for: the kubelet's preferred-allocation
    # call carries every free ID, and must still be answered.
    "ids-per-request-below-device-count": Case(
        lambda _: {
            "resources": [virtual("example.com/v", 6)],
            "limits": {"maxIdsPerRequest": 2},
        },
        0,
        {"example.com/v": 6},
    ),
    # A glob matching more than a resource may publish: both say the first N.
    "glob-past-max-devices": Case(
        lambda tmp: {
            "resources": [glob_resource(tmp, 5)],
            "limits": {"maxDevicesPerResource": 3},
        },
        0,
        {"example.com/acc": 3},
    ),
    "replicas-within-limits": Case(
        lambda _: {
            "resources": [virtual("example.com/r", 3, count=2)],
            "limits": {"maxDevicesPerResource": 6, "maxIdsPerRequest": 1},
        },
        0,
        {"example.com/r": 6},
    ),
    "replicas-past-max-devices": Case(
        lambda _: {
            "resources": [virtual("example.com/r", 3, count=2)],
            "limits": {"maxDevicesPerResource": 5},
        },
        2,
        problem="resources[0]: 6 devices (replicas included), more than "
        "limits.maxDevicesPerResource (5)",
    ),
    "env-value-with-nul": Case(
        lambda tmp: {"resources": [glob_resource(tmp, 1, env={"MODE": "a\0b"})]},
        2,
        problem="resources[0].groups[0].env: env variable 'MODE': its value contains a NUL",
    ),
    "env-named-like-the-ids-variable": Case(
        lambda tmp: {"resources": [glob_resource(tmp, 1, env={"DEVPLUG_EXAMPLE_COM_ACC": "x"})]},
        2,
        problem="resources[0].groups[0].env.DEVPLUG_EXAMPLE_COM_ACC: set by devplug to the "
        "allocated device IDs",
    ),
    "socket-path-past-the-unix-limit": Case(
        lambda _: {"resources": [virtual(LONG, 1)]},
        2,
        problem="is longer than 107 bytes, the limit of unix sockets",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_check_says_what_serve_serves(case: Case, short_tmp: Path) -> None:
    config = short_tmp / "devplug.yaml"
    config.write_text(yaml.safe_dump(case.config(short_tmp)))
    checked = devplug("check", "--config", str(config), "-o", "json")
    assert checked.returncode == case.exit, checked.stderr
    with KubeletHarness(short_tmp / "kubelet") as kubelet:
        serve = kubelet.start_serve(config, wait=False)
        if case.exit:
            # One line each, naming the same problem (the socket path in serve's own
            # plugin folder), and serve stops before serving anything.
            assert serve.wait(timeout=30) == case.exit
            for said in (checked.stderr, serve.output):
                assert len(said.splitlines()) == 1, said
                assert case.problem in said
            assert not list(kubelet.plugin_dir.glob("devplug-*.sock"))
            return
        report = json.loads(checked.stdout)
        counts = {r["name"]: len(r["devices"]) for r in report["resources"]}
        assert counts == case.counts
        for name, count in counts.items():
            status = kubelet.wait_for_resource(name, capacity=count)
            assert status.capacity == count
            listed = {r["id"] for r in report["resources"][0]["devices"]}
            if len(counts) == 1:
                assert set(kubelet.device_ids(name)) == listed
            pod = kubelet.admit({name: 1})
            assert pod.admitted, pod
        assert serve.stop() == 0
