"""The config file: every refused case through the real `devplug check`, and the device
IDs, replicas, globs and env names a good config gives."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from devplug.config.ids import cap_id, ids_env_name, path_device_id, replica_ids, virtual_device_id
from devplug.sources import (
    ConfigError,
    HostDevicePlugin,
    VirtualPlugin,
    build_plugins,
    load_config,
    load_default_config,
    parse_config,
)

# -- refused configs: one real `devplug check` per case ---------------------------------


class Bad(NamedTuple):
    text: str | None  # None: the file does not exist
    field: str  # what follows "<file>: " (the field path, or line:column for YAML)
    problem: str


R = "resources: [{name: example.com/a, "
G = "resources: [{name: example.com/a, groups: [{paths: [{path: "

BAD = {
    "id-on-glob": Bad(
        G + "/dev/tty*}], id: tty}]}]", "resources[0].groups[0].id", "not allowed with a glob"
    ),
    "id-too-long": Bad(
        G + "/dev/kvm}], id: " + "k" * 64 + "}]}]",
        "resources[0].groups[0].id",
        "longer than 63",
    ),
    "id-with-replica-separator": Bad(
        G + "/dev/kvm}], id: 'a::b'}]}]", "resources[0].groups[0].id", "separator"
    ),
    "duplicate-id": Bad(
        G + "/dev/kvm}], id: x}, {paths: [{path: /dev/null}], id: x}]}]",
        "resources[0].groups[1].id",
        "already the ID",
    ),
    "unknown-key": Bad(R + "virtual: 1, colour: red}]", "resources[0].colour", "unknown key"),
    "unknown-nested-key": Bad(
        G + "/dev/kvm, containerpath: /dev/kvm}]}]}]",
        "resources[0].groups[0].paths[0].containerpath",
        "unknown key",
    ),
    "unknown-top-key": Bad("resources: []\nextra: 1\n", "extra", "unknown key"),
    "bad-resource-name": Bad(
        "resources: [{name: kvm, virtual: 1}]", "resources[0].name", "no vendor domain"
    ),
    "reserved-resource-name": Bad(
        "resources: [{name: kubernetes.io/kvm, virtual: 1}]",
        "resources[0].name",
        "reserved for native resources",
    ),
    "duplicate-resource-name": Bad(
        R + "virtual: 1}, {name: example.com/a, virtual: 2}]",
        "resources[1].name",
        "duplicate resource 'example.com/a', see resources[0]",
    ),
    "count-zero": Bad(
        R + "virtual: 1, count: 0}]", "resources[0].count", "expected an integer >= 1, got 0"
    ),
    "count-not-integer": Bad(
        R + "virtual: 1, count: two}]", "resources[0].count", "expected an integer, got a string"
    ),
    "count-too-big": Bad(
        R + "virtual: 1, count: 100000}]", "resources[0].count", "expected an integer <= 1000"
    ),
    "virtual-zero": Bad(
        R + "virtual: 0}]", "resources[0].virtual", "expected an integer >= 1, got 0"
    ),
    "relative-path": Bad(
        G + "dev/kvm}]}]}]",
        "resources[0].groups[0].paths[0].path",
        "expected an absolute path, got 'dev/kvm'",
    ),
    "path-outside-dev": Bad(
        G + "/tmp/kvm}]}]}]", "resources[0].groups[0].paths[0].path", "'/tmp/kvm' is outside /dev"
    ),
    "path-escaping-dev": Bad(
        G + "/dev/../etc/shadow}]}]}]", "resources[0].groups[0].paths[0].path", "contains '..'"
    ),
    "bad-permissions": Bad(
        G + "/dev/kvm, permissions: rx}]}]}]",
        "resources[0].groups[0].paths[0].permissions",
        "permissions 'rx' must combine r, w and m",
    ),
    "relative-container-path": Bad(
        G + "/dev/kvm, containerPath: kvm}]}]}]",
        "resources[0].groups[0].paths[0].containerPath",
        "expected an absolute path",
    ),
    "container-path-on-glob": Bad(
        G + "'/dev/kvm*', containerPath: /dev/kvm}]}]}]",
        "resources[0].groups[0].paths[0].containerPath",
        "not allowed on a glob path",
    ),
    "bad-cdi-name": Bad(
        G + "/dev/kvm}], cdiDevices: [vendor.com/class=ok, nope]}]}]",
        "resources[0].groups[0].cdiDevices[1]",
        "CDI device name 'nope' is not fully qualified",
    ),
    "negative-numa-node": Bad(
        G + "/dev/kvm}], numaNode: -1}]}]",
        "resources[0].groups[0].numaNode",
        "expected an integer >= 0",
    ),
    "env-not-string": Bad(
        G + "/dev/kvm}], env: {A: 1}}]}]",
        "resources[0].groups[0].env[*]",
        "expected a string, got an integer",
    ),
    "relative-mount": Bad(
        G + "/dev/kvm}], mounts: [{hostPath: lib}]}]}]",
        "resources[0].groups[0].mounts[0].hostPath",
        "expected an absolute path",
    ),
    "no-paths": Bad(
        "resources: [{name: example.com/a, groups: [{paths: []}]}]",
        "resources[0].groups[0].paths",
        "expected at least one path",
    ),
    "duplicate-device-id": Bad(
        G + "/dev/kvm}]}, {paths: [{path: /dev/kvm}]}]}]",
        "resources[0].groups[1].paths[0].path",
        "device ID 'kvm' is already the ID of resources[0].groups[0]",
    ),
    "both-groups-and-virtual": Bad(
        G + "/dev/kvm}]}], virtual: 2}]", "resources[0]", "both 'groups' and 'virtual'"
    ),
    "neither-groups-nor-virtual": Bad(
        "resources: [{name: example.com/a, count: 2}]",
        "resources[0]",
        "neither 'groups' nor 'virtual'",
    ),
    "no-resources": Bad("resources: []", "resources", "expected at least one resource"),
    "resources-missing": Bad("{}", "resources", "required key is missing"),
    "not-a-mapping": Bad("- a\n- b\n", "", "expected a mapping, got a list"),
    "empty-file": Bad("", "", "the config is empty"),
    "yaml-syntax": Bad("resources:\n  - {name: example.com/a, virtual: 1\n", "3:1", "invalid YAML"),
    "missing-file": Bad(None, "", "cannot read the config: No such file or directory"),
}


class Result(NamedTuple):
    path: Path
    returncode: int
    stdout: str
    stderr: str


def devplug(*args: str | Path, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "devplug.cli.main", *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def check_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Run `devplug check` on every bad config (real processes, as many at once as there
    are CPUs: all at once, a busy 2-core machine ran out of time)."""
    root = tmp_path_factory.mktemp("bad")

    def check(case: str) -> Result:
        bad = BAD[case]
        path = root / case / "config.yaml"
        path.parent.mkdir()
        if bad.text is not None:
            path.write_text(bad.text)
        process = devplug("check", "--config", path, cwd=path.parent)
        stdout, stderr = process.communicate(timeout=120)
        return Result(path, process.returncode, stdout, stderr)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(BAD, pool.map(check, BAD), strict=True))


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_is_refused_in_one_line(case: str, check_results: dict[str, Result]) -> None:
    bad, result = BAD[case], check_results[case]
    assert result.returncode == 2, result
    assert result.stdout == ""
    message = result.stderr.rstrip("\n")
    assert "\n" not in message, f"not one line: {message!r}"
    if case == "yaml-syntax":  # the place is line:column
        prefix = f"{result.path}:{bad.field}: "
    elif bad.field:
        prefix = f"{result.path}: {bad.field}: "
    else:
        prefix = f"{result.path}: "
    assert message.startswith(prefix), message
    assert bad.problem in message


def test_the_example_message_of_the_reference() -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(R + "virtual: 1, count: 0}]", "config.yaml")
    assert str(error.value) == "config.yaml: resources[0].count: expected an integer >= 1, got 0"


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("resources: [{name: example.com/a, virtual: 1, bogus: 1}]")
    with pytest.raises(ConfigError, match=r"devices\.yaml: resources\[0\]\.bogus: unknown key$"):
        load_config(path)


# -- good configs ------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = parse_config(G + "/dev/null}]}]}]")
    resource = config.resources[0]
    assert (resource.count, resource.allow_any_path, resource.preferred_allocation) == (
        1,
        False,
        True,
    )
    [plugin] = build_plugins(config)
    assert isinstance(plugin, HostDevicePlugin)
    assert plugin.preferred_allocation is True
    [device] = plugin.discover()
    assert device.id == "null"
    assert device.healthy
    [node] = device.nodes
    assert (node.host_path, node.container_path, node.permissions) == (
        "/dev/null",
        "/dev/null",
        "rw",
    )
    assert device.mounts == ()
    assert dict(device.env) == {}
    assert device.numa_nodes == ()


def test_every_field_reaches_the_device() -> None:
    config = parse_config(
        """
resources:
  - name: example.com/zero
    preferredAllocation: false
    groups:
      - paths:
          - {path: /dev/zero, permissions: r, containerPath: /dev/in}
          - {path: /dev/null, permissions: rwm}
        mounts:
          - {hostPath: /usr/lib, containerPath: /opt/lib, readOnly: true}
          - {hostPath: /etc/hostname}
        env: {ZERO: "1"}
        annotations: {example.com/kind: zero}
        cdiDevices: [example.com/zero=all]
        numaNode: 1
"""
    )
    [plugin] = build_plugins(config)
    assert plugin.preferred_allocation is False
    [device] = plugin.discover()
    assert device.id == "zero"
    assert [(n.host_path, n.container_path, n.permissions) for n in device.nodes] == [
        ("/dev/zero", "/dev/in", "r"),
        ("/dev/null", "/dev/null", "rwm"),
    ]
    assert [(m.host_path, m.container_path, m.read_only) for m in device.mounts] == [
        ("/usr/lib", "/opt/lib", True),
        ("/etc/hostname", "/etc/hostname", False),
    ]
    assert dict(device.env) == {"ZERO": "1"}
    assert dict(device.annotations) == {"example.com/kind": "zero"}
    assert device.cdi_devices == ("example.com/zero=all",)
    assert device.numa_nodes == (1,)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/dev/kvm", "kvm"),
        ("/dev/bus/usb/001/002", "bus-usb-001-002"),
        ("/dev/dri/renderD128", "dri-renderD128"),
        ("/dev//net/tun", "net-tun"),
        ("/opt/devices/widget0", "opt-devices-widget0"),
        ("/dev/odd name,1", "odd_name_1"),
    ],
)
def test_device_id_of_a_path(path: str, expected: str) -> None:
    assert path_device_id(path) == expected


def test_virtual_ids_and_replicas() -> None:
    config = parse_config(
        "resources: [{name: example.com/fake, virtual: 3},"
        " {name: example.com/shared, virtual: 2, count: 3}]"
    )
    fake, shared = build_plugins(config)
    assert isinstance(fake, VirtualPlugin)
    assert isinstance(shared, VirtualPlugin)
    assert [d.id for d in fake.discover()] == ["fake-0", "fake-1", "fake-2"]
    assert [d.id for d in shared.discover()] == [
        f"shared-{i}::{k}" for i in range(2) for k in range(3)
    ]
    assert all(d.healthy and not d.nodes for d in shared.discover())
    assert virtual_device_id("example.com/gpu", 7) == "gpu-7"


def test_host_replicas_share_the_nodes() -> None:
    [plugin] = build_plugins(parse_config(G + "/dev/null}]}], count: 3}]"))
    devices = plugin.discover()
    assert [d.id for d in devices] == ["null::0", "null::1", "null::2"]
    assert len({d.nodes for d in devices}) == 1


def test_a_group_can_name_its_device() -> None:
    [plugin] = build_plugins(
        parse_config(
            G + "/dev/null, containerPath: /dev/nvidia0}], id: nvidia0},"
            " {paths: [{path: /dev/zero}]}], count: 2}]"
        )
    )
    devices = plugin.discover()
    assert [d.id for d in devices] == ["nvidia0::0", "nvidia0::1", "zero::0", "zero::1"]
    assert devices[0].nodes[0].container_path == "/dev/nvidia0"


def test_ids_do_not_depend_on_discovery_order(tmp_path: Path) -> None:
    text = (
        f"resources: [{{name: example.com/w, allowAnyPath: true,"
        f" groups: [{{paths: [{{path: '{tmp_path}/w*'}}]}}]}}]"
    )
    for name in ("w2", "w0", "w1"):
        (tmp_path / name).touch()
    [first] = build_plugins(parse_config(text))
    ids = [d.id for d in first.discover()]
    (tmp_path / "w1").unlink()
    (tmp_path / "w1").touch()
    [second] = build_plugins(parse_config(text))
    assert [d.id for d in second.discover()] == ids
    assert ids == [cap_id(path_device_id(str(tmp_path / f"w{i}"))) for i in range(3)]


def test_glob_expansion(tmp_path: Path) -> None:
    for name in ("a0", "a1", "b0", "ctl"):
        (tmp_path / name).touch()
    config = parse_config(
        f"""
resources:
  - name: example.com/glob
    allowAnyPath: true
    groups:
      - paths:
          - path: {tmp_path}/a*
          - path: {tmp_path}/ctl
            permissions: r
      - paths:
          - path: {tmp_path}/b?
          - path: {tmp_path}/[a]0
      - paths:
          - path: {tmp_path}/none*
"""
    )
    [plugin] = build_plugins(config)
    devices = plugin.discover()
    nodes = [[n.host_path for n in d.nodes] for d in devices]
    t = str(tmp_path)
    # One device per match; the group's literal paths join every one of them.
    assert nodes[:2] == [[f"{t}/a0", f"{t}/ctl"], [f"{t}/a1", f"{t}/ctl"]]
    # Several globs in a group: each match of each is a device (a0 is already taken).
    assert nodes[2:] == [[f"{t}/b0"]]
    assert [d.id for d in devices] == [cap_id(path_device_id(n[0])) for n in nodes]
    # ... and a path that gives an ID already served is left out, with a warning.
    assert any(w.startswith(f"example.com/glob: {t}/a0 gives device ID") for w in plugin.warnings)
    assert any(
        w == f"example.com/glob: groups[2].paths[0].path: '{t}/none*' matches nothing"
        for w in plugin.warnings
    )


def test_long_ids_are_capped_uniquely_and_stably() -> None:
    long_a = "/dev/" + "x" * 70 + "/a"
    long_b = "/dev/" + "x" * 70 + "/b"
    full = path_device_id(long_a)
    capped = cap_id(full)
    assert len(capped) == 63
    assert capped == full[:52] + "-" + hashlib.sha256(full.encode()).hexdigest()[:10]
    assert cap_id(full) == capped  # stable
    assert cap_id(path_device_id(long_b)) != capped  # unique
    assert cap_id("short") == "short"
    replicas = replica_ids(full, 12)
    assert len(replicas) == 12
    assert len(set(replicas)) == 12
    assert all(len(r) <= 63 for r in replicas)
    assert replicas[11].endswith("::11")
    assert replicas[11].startswith(full[:40])
    # Virtual IDs are capped the same way.
    name = "example.com/" + "v" * 63
    [plugin] = build_plugins(parse_config(f"resources: [{{name: {name}, virtual: 2}}]"))
    assert all(len(d.id) <= 63 for d in plugin.discover())


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("example.com/kvm", "DEVPLUG_EXAMPLE_COM_KVM"),
        ("nvidia.com/gpu", "DEVPLUG_NVIDIA_COM_GPU"),
        ("my-vendor.io/fpga_x.2", "DEVPLUG_MY_VENDOR_IO_FPGA_X_2"),
    ],
)
def test_ids_env_name(name: str, env: str) -> None:
    assert ids_env_name(name) == env
    [plugin] = build_plugins(parse_config(f"resources: [{{name: {name}, virtual: 1}}]"))
    assert plugin.ids_env == env


def test_packaged_default_config() -> None:
    config = load_default_config()
    plugins = {p.resource_name: p for p in build_plugins(config)}
    null = plugins["devplug.io/null"]
    assert [d.id for d in null.discover()] == [f"null::{k}" for k in range(4)]
    assert all(d.healthy for d in null.discover())
    assert any(isinstance(p, VirtualPlugin) for p in plugins.values())
