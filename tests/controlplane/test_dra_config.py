"""DRA in the config and the CLI: `mode` and `dra:` checked with one-line errors,
`devplug check` showing the slices, `devplug serve` loading the Kubernetes client
only when a resource is served through DRA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import FAST_RECONNECT
from devplug.kube.dranames import default_driver_name, device_name
from devplug.sources import ConfigError, parse_config
from tests.dra_helpers import DRIVER, NodeDirs, accelerator_config

TIMEOUT_S = 30


def devplug(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={**os.environ, **(env or {})},
    )


def config_text(resource: dict[str, object]) -> str:
    base = {"name": "example.com/acc", "virtual": 2}
    return yaml.safe_dump({"resources": [{**base, **resource}]})


def test_mode_defaults_to_device_plugin() -> None:
    config = parse_config(config_text({}))
    assert config.resources[0].mode == "devicePlugin"
    assert config.resources[0].dra is None


@pytest.mark.parametrize(
    ("resource", "message"),
    [
        ({"mode": "drivers"}, "resources[0].mode: Invalid enum value 'drivers'"),
        (
            {"mode": "dra", "dra": {"driver": "Not_A_Domain"}},
            "resources[0].dra.driver: driver name 'Not_A_Domain' must be a lower-case DNS",
        ),
        (
            {"dra": {"attributes": {"bad-name": 1}}},
            "resources[0].dra.attributes.bad-name: attribute name 'bad-name' must be a C "
            "identifier",
        ),
        (
            {"dra": {"attributes": {"model": "x" * 65}}},
            "resources[0].dra.attributes.model: attribute 'model': value longer than 64",
        ),
        (
            {"dra": {"attributeNames": {"model": "product name"}}},
            "resources[0].dra.attributeNames.model: attribute name 'product name'",
        ),
        ({"dra": {"driverName": "x.com"}}, "resources[0].dra.driverName: unknown key"),
        (
            {"mode": "both"},
            "resources[0].mode: mode 'both' serves 'example.com/acc' as a device plugin and "
            "as the extended resource of its DRA DeviceClass (dra.extendedResourceName): a "
            "node serves a name one way",
        ),
        (
            {"mode": "both", "dra": {"extendedResourceName": "example.com/acc"}},
            "resources[0].mode: mode 'both' serves 'example.com/acc' as a device plugin",
        ),
        (
            {"mode": "dra", "dra": {"extendedResourceName": "acc"}},
            "resources[0].dra.extendedResourceName: 'acc' has no vendor domain",
        ),
        ({"nodeModeLabel": "bad key/x/y"}, "resources[0].nodeModeLabel: 'bad key/x/y' is not"),
        (
            {"dra": {"taintEffect": "PreferNoSchedule"}},
            "resources[0].dra.taintEffect: Invalid enum value 'PreferNoSchedule'",
        ),
    ],
)
def test_bad_dra_settings_give_one_line(resource: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(config_text(resource), "c.yaml")
    assert str(error.value).startswith(f"c.yaml: {message}")
    assert "\n" not in str(error.value)


def test_a_name_counted_on_a_node_is_not_also_an_extended_resource_of_dra() -> None:
    """KEP 5004's rule: a node serves an extended resource as a device plugin or
    through DRA. Another resource's counted name is refused as well; `both` with claims
    only ('') or another name is fine."""
    text = yaml.safe_dump(
        {
            "resources": [
                {"name": "example.com/a", "virtual": 1},
                {
                    "name": "example.com/b",
                    "virtual": 1,
                    "mode": "dra",
                    "dra": {"extendedResourceName": "example.com/a"},
                },
            ]
        }
    )
    with pytest.raises(ConfigError, match=r"resources\[1\]\.mode: 'example\.com/a' is served as a"):
        parse_config(text, "c.yaml")
    for extended in ("", "example.com/acc-dra"):
        config = parse_config(
            config_text({"mode": "both", "dra": {"extendedResourceName": extended}})
        )
        assert config.resources[0].mode == "both"


def test_node_labels_choose_the_mode_per_node() -> None:
    from devplug.config.root import apply_node_modes

    text = config_text({"mode": "devicePlugin", "nodeModeLabel": "example.com/acc-mode"})
    for labels, mode in (
        ({}, "devicePlugin"),
        ({"other": "dra"}, "devicePlugin"),
        ({"example.com/acc-mode": "dra"}, "dra"),
    ):
        config = parse_config(text, "c.yaml")
        apply_node_modes(config, labels, "node-a", "c.yaml")
        assert config.resources[0].mode == mode
    config = parse_config(text, "c.yaml")
    with pytest.raises(ConfigError) as error:
        apply_node_modes(config, {"example.com/acc-mode": "DRA"}, "node-a", "c.yaml")
    assert str(error.value) == (
        "c.yaml: resources[0].nodeModeLabel: node node-a has example.com/acc-mode='DRA', "
        "expected one of devicePlugin, dra, both"
    )
    with pytest.raises(ConfigError) as error:
        apply_node_modes(config, {"example.com/acc-mode": "both"}, "node-a", "c.yaml")
    assert str(error.value).startswith(
        "c.yaml (modes of node node-a): resources[0].mode: mode 'both' serves"
    )


def test_check_prints_the_device_classes_a_config_implies(short_tmp: Path) -> None:
    config = short_tmp / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {"name": "example.com/plain", "virtual": 1},
                    {"name": "example.com/a", "virtual": 1, "mode": "dra"},
                    {
                        "name": "example.com/b",
                        "virtual": 1,
                        "mode": "both",
                        "dra": {"driver": "b.example.org", "extendedResourceName": ""},
                    },
                    {"name": "example.com/c", "virtual": 1, "nodeModeLabel": "example.com/c-mode"},
                ]
            }
        )
    )
    for flag in ("-o", "--output"):
        result = devplug("check", "--config", config, "--device-classes", flag, "yaml")
        assert result.returncode == 0, result.stderr
        *classes, role = list(yaml.safe_load_all(result.stdout))
        assert [c["metadata"]["name"] for c in classes] == [
            "a.example.com",
            "b.example.org",
            "c.example.com",
        ]
        assert role["kind"] == "ClusterRole"
        [rule] = role["rules"]
        assert rule["resourceNames"] == ["a.example.com", "b.example.org", "c.example.com"]
        a, b, c = classes
        assert a == {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "a.example.com"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "a.example.com"'}}],
                "extendedResourceName": "example.com/a",
            },
        }
        assert "extendedResourceName" not in b["spec"]  # claims only
        # Counted where the node has no label: the class serves the nodes labelled dra.
        assert c["spec"]["extendedResourceName"] == "example.com/c"
    text = devplug("check", "--config", config).stdout
    assert "  DeviceClass a.example.com, asked by count as example.com/a" in text
    assert "  DeviceClass b.example.org, claims only" in text
    assert "  mode devicePlugin, or the value of the node's label example.com/c-mode" in text


def test_two_resources_cannot_share_a_driver() -> None:
    text = yaml.safe_dump(
        {
            "resources": [
                {"name": "example.com/a", "virtual": 1, "mode": "dra", "dra": {"driver": "x.com"}},
                {"name": "example.com/b", "virtual": 1, "mode": "dra", "dra": {"driver": "x.com"}},
            ]
        }
    )
    with pytest.raises(ConfigError, match=r"resources\[1\]\.dra\.driver: driver 'x\.com' already"):
        parse_config(text, "c.yaml")


def test_names_published_in_slices() -> None:
    assert default_driver_name("devplug.io/zero") == "zero.devplug.io"
    assert device_name("acc1") == "acc1"
    assert device_name("null::0").startswith("null-0-")
    assert device_name("a_b") != device_name("a-b")
    assert len(device_name("x" * 63 + "_")) <= 63


def test_check_shows_the_slices(short_tmp: Path) -> None:
    dirs = NodeDirs(short_tmp)
    config = accelerator_config(dirs, {"acc0": "u250", "acc1": "u280"}, mode="both")
    result = devplug("check", "--config", config, "--node-name", "node-a")
    assert result.returncode == 0, result.stderr
    assert f"DRA driver {DRIVER}, slice node-a-acc-example-com-0 (node node-a): 2 device(s)" in (
        result.stdout
    )
    assert "acc1: model=u280 vendor=xilinx capacity memory=8589934592" in result.stdout
    report = json.loads(
        devplug("check", "--config", config, "--node-name", "node-a", "--output", "json").stdout
    )
    [resource] = report["resources"]
    assert (resource["mode"], resource["draDriver"]) == ("both", DRIVER)
    [body] = resource["slices"]
    assert body["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    devices = {d["name"]: d for d in body["spec"]["devices"]}
    assert devices["acc0"]["attributes"] == {
        "model": {"string": "u250"},
        "vendor": {"string": "xilinx"},
    }
    assert devices["acc0"]["capacity"] == {"memory": {"value": str(8 << 30)}}


def test_check_splits_big_pools_into_slices_of_128(short_tmp: Path) -> None:
    config = short_tmp / "c.yaml"
    config.write_text(config_text({"virtual": 300, "mode": "dra"}))
    report = json.loads(
        devplug("check", "--config", config, "--node-name", "n", "--output", "json").stdout
    )
    slices = report["resources"][0]["slices"]
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}


def test_serve_without_dra_does_not_load_the_kubernetes_client(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "plugins"
    command = [sys.executable, "-X", "importtime", "-m", "devplug.cli.main", "serve"]
    proc = subprocess.Popen(
        [*command, "--plugin-dir", str(plugin_dir)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        socket = plugin_dir / "devplug-devplug.io-fake.sock"
        with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
            pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), wait_for_ready=True, timeout=10
            )
    finally:
        proc.terminate()
        _, errors = proc.communicate(timeout=10)
    imported = {line.rsplit("|", 1)[-1].strip() for line in errors.splitlines() if "|" in line}
    assert "devplug.sources.hostdev" in imported  # the check sees what serve loads
    assert not {m for m in imported if m.startswith(("kubernetes", "devplug.framework.dra"))}


def test_serve_in_dra_mode_refuses_an_unusable_kubeconfig(short_tmp: Path) -> None:
    dirs = NodeDirs(short_tmp)
    config = accelerator_config(dirs, {"acc0": "u250"})
    missing = short_tmp / "no-kubeconfig"
    result = devplug("serve", "--config", config, "--kubeconfig", missing)
    assert result.returncode == 2
    assert result.stderr.startswith("devplug serve: DRA: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_split_resource_names_no_single_driver() -> None:
    text = yaml.safe_dump(
        {
            "resources": [
                {
                    "name": "example.com/fpga",
                    "mode": "dra",
                    "dra": {"driver": "fpga.example.com"},
                    "split": {"by": "productID", "models": {"0x500c": "u280"}},
                    "groups": [{"pci": {"vendor": "0x10ee"}}],
                }
            ]
        }
    )
    with pytest.raises(ConfigError, match=r"resources\[0\]\.dra\.driver: not allowed with 'split'"):
        parse_config(text, "c.yaml")


def test_gpus_through_dra_carry_their_memory_as_a_capacity(short_tmp: Path) -> None:
    """A GPU entry (fake NVML) in DRA mode: slices with model, UUID, compute capability
    and memory, which a 'GPU with at least 40 GiB' selector compares."""
    import os

    from devplug.fakes.nvml import FakeGpuHost, eight_gpus

    host = FakeGpuHost(short_tmp / "host", eight_gpus())
    config = short_tmp / "gpu.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "nvidia": {"hostRoot": str(host.host_root)},
                        "mode": "dra",
                        "dra": {"driver": "gpu.devplug.io"},
                    }
                ]
            }
        )
    )
    check = ["check", "--config", str(config), "--node-name", "gpu-node", "--output", "json"]
    result = subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", *check],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **host.env},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [resource] = json.loads(result.stdout)["resources"]
    assert resource["draDriver"] == "gpu.devplug.io"
    [body] = resource["slices"]
    devices = body["spec"]["devices"]
    assert len(devices) == 8
    first = devices[0]
    assert int(first["capacity"]["memory"]["value"]) >= 40 << 30
    assert {"uuid", "model", "computeCapability", "index"} <= set(first["attributes"])


def test_driver_names_of_an_entry_with_several_resources() -> None:
    from devplug.config.dra import DraSpec, plugin_driver_name

    named = DraSpec(driver="gpu.devplug.io")
    assert plugin_driver_name("nvidia.com/gpu", "nvidia.com/gpu", None) == "gpu.nvidia.com"
    assert plugin_driver_name("nvidia.com/gpu", "nvidia.com/gpu", named) == "gpu.devplug.io"
    assert (
        plugin_driver_name("nvidia.com/mig-1g.10gb", "nvidia.com/gpu", named)
        == "mig-1g-10gb.gpu.devplug.io"
    )
    assert plugin_driver_name("example.com/fpga-u280", "example.com/fpga", None) == (
        "fpga-u280.example.com"
    )
