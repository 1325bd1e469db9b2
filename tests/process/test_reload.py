"""Config reload of a real `devplug serve`: a ConfigMap-style symlink swap, SIGHUP, a
bad config refused while the old one keeps serving."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import yaml
from serve_helpers import free_port, metric_lines, wait_for_output

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


def start(kubelet: KubeletHarness, volume: ConfigMapVolume, *args: str) -> PluginProcess:
    volume.write([KEPT, GONE, CHANGED])
    return kubelet.start_serve(volume.path, *args)


def reload_counts(port: int) -> list[str]:
    return metric_lines(port, "devplug_config_reloads_total")


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
        port = free_port()
        serve = start(kubelet, volume, "--metrics-port", str(port))
        volume.write("resources:\n  - name: example.com/kept\n    count: 0\n    virtual: 1\n")
        output = wait_for_output(serve, REFUSED)
        line = next(line for line in output.splitlines() if REFUSED in line)
        assert line.endswith(f"{volume.path}: resources[0].count: expected an integer >= 1, got 0")
        assert reload_counts(port) == [
            'devplug_config_reloads_total{result="applied"} 0.0',
            'devplug_config_reloads_total{result="refused"} 1.0',
        ]
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
        assert reload_counts(port) == [
            'devplug_config_reloads_total{result="applied"} 1.0',
            'devplug_config_reloads_total{result="refused"} 2.0',
        ]
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


def test_a_reload_reads_the_hardware_where_serve_was_told_and_follows_it_in_labels_and_cdi(
    short_tmp: Path,
) -> None:
    """--sysfs-root/--dev-root hold for the resources a reload adds; the feature file and
    the CDI specs gain an added resource's entries and lose a removed one's."""
    from hw_helpers import standard_tree, wait_file

    from devplug.outputs.nfd import parse_features

    tree = standard_tree(short_tmp / "hw")
    features = short_tmp / "features.d" / "devplug"
    cdi = short_tmp / "cdi"
    u250 = {
        "name": "example.com/u250",
        "groups": [{"pci": {"vendor": "10ee", "device": "500c"}}],
        "cdi": {"mode": "both", "dir": str(cdi)},
    }
    u250_spec = cdi / "devplug-example.com_u250.json"
    vfio = {
        "name": "example.com/vfio",
        "groups": [{"pci": {"vendor": "10ee", "driver": "vfio-pci"}}],
        "cdi": {"dir": str(cdi)},
    }
    vfio_spec = cdi / "devplug-example.com_vfio.json"
    with KubeletHarness() as kubelet:
        config = short_tmp / "devplug.yaml"
        config.write_text(yaml.safe_dump({"resources": [KEPT, u250]}))
        hardware = ("--sysfs-root", str(tree.sys), "--dev-root", str(tree.dev))
        serve = kubelet.start_serve(config, *hardware, "--feature-file", str(features))
        wait_file(u250_spec, lambda text: text is not None)
        wait_file(features, lambda text: "example.com/u250.count=1" in (text or ""))

        config.write_text(yaml.safe_dump({"resources": [KEPT, vfio]}))
        # Found in the fake tree given at start, not in the host's /sys.
        kubelet.wait_for_resource("example.com/vfio", count=1)
        assert kubelet.device_ids("example.com/vfio") == ["0000:d8:00.0"]
        wait_file(vfio_spec, lambda text: text is not None and "0000:d8:00.0" in text)
        wait_file(u250_spec, lambda text: text is None)
        labels = parse_features(
            wait_file(features, lambda text: "example.com/vfio.count" in (text or "")) or ""
        )
        assert labels["example.com/vfio.count"] == "1"
        assert not [name for name in labels if name.startswith("example.com/u250.")]
        assert serve.stop() == 0
    assert not vfio_spec.exists()
    assert not features.exists()


def test_new_hardware_roots_in_the_config_serve_every_resource_again(short_tmp: Path) -> None:
    from hw_helpers import add_u250, roots

    from devplug.fakes.sysfs import FakeSysfs

    before, after = FakeSysfs(short_tmp / "a"), FakeSysfs(short_tmp / "b")
    add_u250(before)
    after.add_pci("0000:d8:00.0", "10ee", "500d", numa_node=1)
    fpga = "resources:\n  - name: example.com/fpga\n    groups: [{pci: {vendor: '10ee'}}]\n"
    with KubeletHarness() as kubelet:
        config = short_tmp / "devplug.yaml"
        config.write_text(roots(before) + fpga)
        serve = kubelet.start_serve(config)
        assert kubelet.device_ids("example.com/fpga") == ["0000:3b:00.0"]
        config.write_text(roots(after) + fpga)
        output = wait_for_output(serve, RELOADED)
        assert "changed example.com/fpga" in output
        kubelet.wait_until(
            lambda: kubelet.device_ids("example.com/fpga") == ["0000:d8:00.0"],
            what="the device under the new roots",
        )
        assert serve.stop() == 0


def test_a_changed_entry_serves_each_of_its_model_pools_again(short_tmp: Path) -> None:
    """Resources named after an entry's models are compared by what they are built from,
    not looked up by the entry's name."""
    from hw_helpers import roots, standard_tree

    tree = standard_tree(short_tmp / "hw")

    def fpga(count: int) -> str:
        return (
            f"{roots(tree)}resources:\n  - name: example.com/fpga\n    count: {count}\n"
            "    groups: [{pci: {vendor: '10ee'}}]\n"
            "    split: {by: productID, models: {'0x500c': u250, '0x500d': u280}}\n"
        )

    with KubeletHarness() as kubelet:
        config = short_tmp / "devplug.yaml"
        config.write_text(fpga(1))
        serve = kubelet.start_serve(config)
        config.write_text(fpga(2))
        output = wait_for_output(serve, RELOADED)
        assert "changed example.com/fpga-u250, example.com/fpga-u280" in output
        for pool in ("example.com/fpga-u250", "example.com/fpga-u280"):
            kubelet.wait_for_resource(pool, capacity=2)
        assert serve.stop() == 0
