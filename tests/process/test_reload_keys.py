"""A config reload applies every top-level key of the config: one change per key of the
schema (a key added to the schema without a case here fails), each made to the file of
a real `devplug serve` and seen where it acts (the kubelet simulator, the feature file);
and SIGHUP never ends a `serve` that is still starting."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import yaml
from serve_helpers import wait_for_gone, wait_for_output, wait_for_path

from devplug.config.root import Config
from devplug.fakes.sysfs import FakeSysfs, Node, make_node
from devplug.testing import KubeletHarness

RELOADED = "config reloaded from"
V = "example.com/v"
FPGA = "example.com/fpga"
CARD = Node("drm", "dri/card0", 226, 0)


def virtual(n: int) -> list[dict[str, object]]:
    return [{"name": V, "virtual": n}]


def fpgas(tmp: Path, name: str, count: int) -> FakeSysfs:
    """A sysfs tree under `tmp/name` with `count` Xilinx cards, each with a DRM node."""
    fs = FakeSysfs(tmp / name)
    for i in range(count):
        fs.add_pci(f"0000:0{i + 1}:00.0", "0x10ee", "0x500c", nodes=[CARD] if i == 0 else [])
    return fs


def fpga_config(sysfs: Path, dev: Path) -> dict[str, object]:
    return {
        "resources": [{"name": FPGA, "groups": [{"pci": {"vendor": "10ee"}}]}],
        "sysfsRoot": str(sysfs),
        "devRoot": str(dev),
    }


@dataclass(frozen=True)
class Change:
    """The config before and after (given the test's folder), and a wait for the new
    value to act once reloaded (what it says in the reload line: `said`)."""

    before: Callable[[Path], dict[str, object]]
    after: Callable[[Path], dict[str, object]]
    applied: Callable[[KubeletHarness, Path], None]
    said: str
    # What the value before does, seen before the change.
    first: Callable[[KubeletHarness], None] = lambda _kubelet: None


def folders(tmp: Path) -> Path:
    """NFD's folders before and after (there, as NFD makes them); the first file."""
    for name in ("a", "b"):
        (tmp / name).mkdir()
    return tmp / "a" / "features"


def features_moved(kubelet: KubeletHarness, tmp: Path) -> None:
    wait_for_path(tmp / "b" / "features")
    assert f"{V}.count=2" in (tmp / "b" / "features").read_text()
    wait_for_gone(tmp / "a" / "features")


def two_refused(kubelet: KubeletHarness) -> None:
    refused = kubelet.admit({V: 2})
    assert not refused.admitted
    assert "limits.maxIdsPerRequest" in refused.message


def two_at_once(kubelet: KubeletHarness, _tmp: Path) -> None:
    """A pod of two devices, refused under maxIdsPerRequest 1, is admitted under 2."""
    kubelet.wait_for_registration(V, after=1)
    kubelet.wait_for_resource(V, count=4)
    pod = kubelet.admit({V: 2})
    assert pod.admitted, pod


def card_from(folder: str) -> Callable[[KubeletHarness, Path], None]:
    def applied(kubelet: KubeletHarness, tmp: Path) -> None:
        kubelet.wait_for_resource(FPGA, count=1)
        pod = kubelet.admit({FPGA: 1})
        assert pod.admitted, pod
        assert pod.device_nodes() == {"/dev/dri/card0": str(tmp / folder / "dri/card0")}

    return applied


def other_dev(tmp: Path) -> Path:
    """A second /dev with the card's node, for a devRoot that moves."""
    make_node(tmp / "dev2" / "dri" / "card0", 226, 0)
    return tmp / "dev2"


CHANGES: dict[str, Change] = {
    "resources": Change(
        lambda _: {"resources": virtual(1)},
        lambda _: {"resources": virtual(3)},
        lambda kubelet, _: kubelet.wait_for_resource(V, capacity=3) and None,
        f"changed {V}",
    ),
    "limits": Change(
        lambda _: {"resources": virtual(4), "limits": {"maxIdsPerRequest": 1}},
        lambda _: {"resources": virtual(4), "limits": {"maxIdsPerRequest": 2}},
        two_at_once,
        f"changed {V}, set limits",
        first=two_refused,
    ),
    "nodeFeatures": Change(
        lambda tmp: {"resources": virtual(2), "nodeFeatures": {"path": str(folders(tmp))}},
        lambda tmp: {"resources": virtual(2), "nodeFeatures": {"path": str(tmp / "b/features")}},
        features_moved,
        "set nodeFeatures",
    ),
    "sysfsRoot": Change(
        lambda tmp: fpga_config(fpgas(tmp, "one", 1).sys, tmp / "one/dev"),
        lambda tmp: fpga_config(fpgas(tmp, "two", 2).sys, tmp / "one/dev"),
        lambda kubelet, _: kubelet.wait_for_resource(FPGA, capacity=2) and None,
        "set sysfsRoot",
    ),
    "devRoot": Change(
        lambda tmp: fpga_config(fpgas(tmp, "one", 1).sys, tmp / "one/dev"),
        lambda tmp: fpga_config(tmp / "one/sys", other_dev(tmp)),
        card_from("dev2"),
        "set devRoot",
    ),
}


# Keys a reload refuses to change, saying so in one line (each has a case below).
AT_START = {
    "nodeEvents": ({"resources": virtual(1)}, {"resources": virtual(1), "nodeEvents": True})
}


def test_every_top_level_key_of_the_config_has_a_reload_case() -> None:
    keys = {field.encode_name for field in msgspec.structs.fields(Config)}
    assert keys == set(CHANGES) | set(AT_START), "each top-level key needs a case"


@pytest.mark.parametrize("key", AT_START)
def test_a_reload_refuses_a_change_it_cannot_apply_in_one_line(key: str, short_tmp: Path) -> None:
    before, after = AT_START[key]
    config = short_tmp / "devplug.yaml"
    write(config, before)
    with KubeletHarness(short_tmp / "kubelet") as kubelet:
        serve = kubelet.start_serve(config)
        write(config, after)
        output = wait_for_output(serve, "config reload refused")
        [line] = [line for line in output.splitlines() if "config reload refused" in line]
        assert f"{key}: a change takes effect when devplug serve starts again" in line
        assert kubelet.admit({V: 1}).admitted  # the previous config keeps serving
        assert serve.stop() == 0


def write(path: Path, config: dict[str, object]) -> None:
    """Replace the config at once, as an editor or a ConfigMap update does."""
    new = path.with_suffix(".new")
    new.write_text(yaml.safe_dump(config))
    os.replace(new, path)


@pytest.mark.parametrize("key", CHANGES)
def test_a_reload_applies_a_change_of(key: str, short_tmp: Path) -> None:
    change = CHANGES[key]
    config = short_tmp / "devplug.yaml"
    write(config, change.before(short_tmp))
    with KubeletHarness(short_tmp / "kubelet") as kubelet:
        serve = kubelet.start_serve(config)
        change.first(kubelet)
        write(config, change.after(short_tmp))
        output = wait_for_output(serve, RELOADED)
        line = next(line for line in output.splitlines() if RELOADED in line)
        assert change.said in line
        assert "nothing changed" not in line
        change.applied(kubelet, short_tmp)
        assert serve.stop() == 0


def test_sighup_while_serve_starts_does_not_end_it(short_tmp: Path) -> None:
    config = short_tmp / "devplug.yaml"
    write(config, {"resources": virtual(1)})
    with KubeletHarness(short_tmp / "kubelet") as kubelet:
        serve = kubelet.start_serve(config, "--log-level", "debug", wait=False)
        # The first line serve writes: its config is not read yet, nothing is served.
        wait_for_output(serve, "starting, pid")
        os.kill(serve.pid, signal.SIGHUP)
        kubelet.wait_for_resource(V, count=1)
        # The signal held during the start asks for a reload once the reloader runs.
        wait_for_output(serve, RELOADED)
        assert serve.running
        os.kill(serve.pid, signal.SIGHUP)
        wait_for_output(serve, RELOADED, count=2)
        assert serve.stop() == 0
