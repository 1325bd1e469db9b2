"""Config reload of a real `devplug serve`: a ConfigMap-style symlink swap, SIGHUP, a
bad config refused while the old one keeps serving."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import yaml
from serve_helpers import wait_for_output

from devplug.testing import KubeletHarness
from devplug.testing.harness import PluginProcess

RELOADED = "config reloaded from"
REFUSED = "config reload refused"


class ConfigMapVolume:
    """A folder laid out as the kubelet lays out a ConfigMap volume and updated as it
    updates one: `config.yaml -> ..data/config.yaml`, `..data -> ..<version>`, a new
    version made beside the old and `..data` swapped by one rename."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.version = 0
        folder.mkdir(parents=True)
        (folder / "config.yaml").symlink_to("..data/config.yaml")

    @property
    def path(self) -> Path:
        return self.folder / "config.yaml"

    def write(self, resources: list[dict[str, object]] | str) -> None:
        self.version += 1
        old = os.readlink(self.folder / "..data") if (self.folder / "..data").is_symlink() else None
        version = self.folder / f"..v{self.version}"
        version.mkdir()
        text = resources if isinstance(resources, str) else yaml.safe_dump({"resources": resources})
        (version / "config.yaml").write_text(text)
        (self.folder / "..data_tmp").symlink_to(version.name)
        os.rename(self.folder / "..data_tmp", self.folder / "..data")
        if old is not None:
            (self.folder / old / "config.yaml").unlink()
            (self.folder / old).rmdir()


def resource(name: str, virtual: int, count: int = 1) -> dict[str, object]:
    return {"name": name, "virtual": virtual, "count": count}


KEPT = resource("example.com/kept", 2)
GONE = resource("example.com/gone", 1)
CHANGED = resource("example.com/changed", 1)


def start(kubelet: KubeletHarness, volume: ConfigMapVolume) -> PluginProcess:
    volume.write([KEPT, GONE, CHANGED])
    return kubelet.start_serve(volume.path)


def test_a_configmap_update_changes_only_what_changed(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet:
        volume = ConfigMapVolume(short_tmp / "config")
        serve = start(kubelet, volume)
        kept_socket = kubelet.plugin_dir / "devplug-example.com-kept.sock"
        before = kept_socket.stat().st_ino
        pod = kubelet.admit({"example.com/kept": 1}, name="holder")
        assert pod.admitted, pod

        volume.write([KEPT, {**CHANGED, "virtual": 3}, resource("example.com/new", 2)])
        kubelet.wait_for_resource("example.com/new", count=2)
        kubelet.wait_for_resource("example.com/changed", count=3)
        kubelet.wait_until(
            lambda: kubelet.resource("example.com/gone").endpoint == "stopped",  # type: ignore[union-attr]
            what="example.com/gone stopped",
        )
        output = wait_for_output(serve, RELOADED)
        assert (
            "added example.com/new, removed example.com/gone, changed example.com/changed; "
            "kept 1 unchanged" in output
        )
        # The unchanged resource kept its socket, its registration and its stream.
        assert kept_socket.stat().st_ino == before
        assert kubelet.registrations("example.com/kept") == 1
        assert kubelet.resource("example.com/kept").endpoint == "connected"  # type: ignore[union-attr]
        assert kubelet.registrations("example.com/changed") == 2
        assert not (kubelet.plugin_dir / "devplug-example.com-gone.sock").exists()
        # ...and still allocates.
        assert kubelet.admit({"example.com/kept": 1}, name="second").admitted
        assert serve.stop() == 0


def test_a_bad_config_is_refused_and_the_old_one_keeps_serving(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet:
        volume = ConfigMapVolume(short_tmp / "config")
        serve = start(kubelet, volume)
        volume.write("resources:\n  - name: example.com/kept\n    count: 0\n    virtual: 1\n")
        output = wait_for_output(serve, REFUSED)
        line = next(line for line in output.splitlines() if REFUSED in line)
        assert line.endswith(f"{volume.path}: resources[0].count: expected an integer >= 1, got 0")
        for name in ("example.com/kept", "example.com/gone", "example.com/changed"):
            assert kubelet.registrations(name) == 1
            assert kubelet.resource(name).endpoint == "connected"  # type: ignore[union-attr]
        assert kubelet.admit({"example.com/gone": 1}).admitted
        # Valid, but a socket path over the unix limit: refused before anything changes.
        volume.write([KEPT, resource("example.com/" + "x" * 63, 1)])
        output = wait_for_output(serve, REFUSED, count=2)
        refusals = [line for line in output.splitlines() if REFUSED in line]
        assert "is longer than 107 bytes" in refusals[-1]
        assert kubelet.resource("example.com/gone").endpoint == "connected"  # type: ignore[union-attr]
        # A good config after the bad ones applies against the running one.
        volume.write([KEPT])
        wait_for_output(serve, RELOADED)
        kubelet.wait_until(
            lambda: kubelet.resource("example.com/changed").endpoint == "stopped",  # type: ignore[union-attr]
            what="example.com/changed stopped",
        )
        assert serve.stop() == 0


def test_sighup_reloads_and_an_edit_in_place_is_seen(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet:
        config = short_tmp / "devplug.yaml"
        config.write_text(yaml.safe_dump({"resources": [KEPT]}))
        serve = kubelet.start_serve(config)
        os.kill(serve.pid, signal.SIGHUP)
        output = wait_for_output(serve, RELOADED)
        assert f"config reloaded from {config}: nothing changed; kept 1 unchanged" in output
        # An editor writing the file in place (no rename): seen when it is closed.
        config.write_text(yaml.safe_dump({"resources": [KEPT, GONE]}))
        kubelet.wait_for_resource("example.com/gone", count=1)
        assert kubelet.registrations("example.com/kept") == 1
        assert serve.stop() == 0
