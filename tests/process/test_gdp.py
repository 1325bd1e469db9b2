"""The generic device plugin's flags and file, served as they are: its own examples
translated into devplug's config, its refusals in one line, and its flags served to the
kubelet simulator from real device nodes and mounts, started as its DaemonSet starts
devplug's image (`devplug --device ...`)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from gdp_examples import MANIFEST_DEVICES, README_DEVICES
from sim_helpers import cli_command, devplug

from devplug.cli.main import _gdp_words
from devplug.sources import ConfigError
from devplug.sources.gdpfront import Flags, is_gdp_data, load
from devplug.testing import KubeletHarness

NODE = {"permissions": "mrw"}


def translated(*devices: str, **flags: Any) -> list[dict[str, Any]]:
    resources: list[dict[str, Any]] = load(Flags(devices=list(devices), **flags), {}).data[
        "resources"
    ]
    return resources


def paths(*names: str, **extra: Any) -> dict[str, Any]:
    return {"paths": [{"path": name, **extra, **NODE} for name in names]}


def refusal(*devices: str, env: dict[str, str] | None = None, **flags: Any) -> str:
    with pytest.raises(ConfigError) as error:
        load(Flags(devices=list(devices), **flags), env or {}, places=())
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_manifest_devices_become_devplug_resources_of_the_same_names() -> None:
    serial, video, fuse, audio, capture = translated(*MANIFEST_DEVICES)
    assert serial == {
        "name": "squat.ai/serial",
        "groups": [
            paths(p)
            for p in (
                "/dev/ttyUSB*",
                "/dev/ttyACM*",
                "/dev/tty.usb*",
                "/dev/cu.*",
                "/dev/cuaU*",
                "/dev/rfcomm*",
            )
        ],
    }
    assert video == {"name": "squat.ai/video", "groups": [paths("/dev/video0")]}
    assert fuse == {"name": "squat.ai/fuse", "count": 10, "groups": [paths("/dev/fuse")]}
    assert audio == {"name": "squat.ai/audio", "count": 10, "groups": [paths("/dev/snd")]}
    assert capture["name"] == "squat.ai/capture"
    assert capture["groups"][0] == paths("/dev/snd/controlC0", "/dev/snd/pcmC0D0c")
    for card, group in enumerate(capture["groups"][1:], start=1):
        assert group == {
            "paths": [
                {"path": f"/dev/snd/controlC{card}", "containerPath": "/dev/snd/controlC0", **NODE},
                {"path": f"/dev/snd/pcmC{card}D0c", "containerPath": "/dev/snd/pcmC0D0c", **NODE},
            ]
        }


def test_the_readme_examples_keep_their_meaning() -> None:
    examples = {k: translated(v, domain="example.com")[0] for k, v in README_DEVICES.items()}
    assert examples["video"]["groups"] == [paths("/dev/video0")]
    assert examples["serial"]["groups"] == [paths("/dev/ttyUSB*"), paths("/dev/ttyACM*")]
    assert examples["capture"]["groups"] == [paths("/dev/snd/pcmC0D0c", "/dev/snd/controlC0")]
    assert examples["ch340"] == {
        "name": "example.com/ch340",
        "groups": [{"usb": {"vendor": "1a86", "product": "7523"}}],
    }
    assert examples["fuse"]["count"] == 10
    assert examples["optional"]["groups"] == [paths("/dev/ttyS0", "/dev/ttyUSB0", optional=True)]
    assert examples["folder"]["groups"] == [
        {"paths": [{"path": "/dev/ttyUSB*", "containerPath": "/dev/serial/", **NODE}]}
    ]
    # Each entry of a `usb` list selects devices of its own.
    assert examples["usb"]["groups"] == [
        {"usb": {"vendor": "1209", "product": "000f"}},
        {"usb": {"vendor": "1209", "product": "000f", "serial": "00000001"}},
    ]


def test_counts_types_and_keys_as_it_decodes_them() -> None:
    mixed = json.dumps(
        {
            "Name": " share ",
            "GROUPS": [
                {"count": 3, "paths": [{"path": "/dev/a"}]},
                {
                    "paths": [
                        {"path": "/dev/b", "permissions": "r"},
                        {
                            "path": "/srv/data",
                            "type": "Mount",
                            "mountPath": "/data",
                            "readOnly": True,
                        },
                        {
                            "path": "/srv/opt",
                            "type": "Mount",
                            "mountPath": "/opt/",
                            "optional": True,
                        },
                    ],
                    "colour": "blue",
                },
            ],
        }
    )
    settings = load(Flags(devices=[mixed]), {}, places=())
    [share] = settings.data["resources"]
    assert share == {
        "name": "squat.ai/share",
        "groups": [
            {**paths("/dev/a"), "count": 3},
            {
                "paths": [{"path": "/dev/b", "permissions": "r"}],
                "mounts": [
                    {
                        "hostPath": "/srv/data",
                        "containerPath": "/data",
                        "readOnly": True,
                        "required": True,
                    },
                    {"hostPath": "/srv/opt", "containerPath": "/opt/opt", "optional": True},
                ],
                "count": 1,
            },
        ],
    }
    assert settings.warnings == ["--device #1 (share): groups[1].colour: unknown key ignored"]
    # A number in a --device value is read as hex digits; in its file, as the number.
    usb = '{"name": "pico", "groups": [{"usb": [{"vendor": 1209, "product": "000F"}]}]}'
    assert translated(usb)[0]["groups"] == [{"usb": {"vendor": "1209", "product": "000f"}}]


@pytest.mark.parametrize(
    ("device", "flags", "expected"),
    [
        ('{"name": "X", "groups": []}', {}, "--device #1: name: 'X' must match"),
        ('{"name": "a"}', {}, "--device #1: name: 'a' must match"),
        ("name: [", {}, "--device #1:1:8: invalid YAML"),
        ('["video"]', {}, "--device #1: expected a mapping, got a list"),
        (
            '{"name": "mix", "groups": [{"paths": [{"path": "/a"}], "usb": [{"vendor": "1"}]}]}',
            {},
            "--device #1 (mix): groups[0]: cannot define both paths and usb in one group",
        ),
        (
            '{"name": "neg", "groups": [{"count": -1, "paths": [{"path": "/dev/a"}]}]}',
            {},
            "--device #1 (neg): groups[0].count: expected an integer >= 0, got -1",
        ),
        (
            '{"name": "ten", "groups": [{"count": "10", "paths": [{"path": "/dev/a"}]}]}',
            {},
            "--device #1 (ten): groups[0].count: expected an integer, got a string",
        ),
        (
            '{"name": "two", "groups": [{"paths": [{"path": "/dev/a*"}, {"path": "/dev/b*"}]}]}',
            {},
            "--device #1 (two): groups[0].paths[1].path: a second glob in one group",
        ),
        (
            '{"name": "mnt", "groups": [{"paths": [{"path": "/srv/*", "type": "Mount"}]}]}',
            {},
            "--device #1 (mnt): groups[0].paths[0].path: a glob on a Mount path",
        ),
        (
            '{"name": "typ", "groups": [{"paths": [{"path": "/dev/a", "type": "Block"}]}]}',
            {},
            "--device #1 (typ): groups[0].paths[0].type: expected Device or Mount, got 'Block'",
        ),
        (
            '{"name": "rel", "groups": [{"paths": [{"path": "dev/a"}]}]}',
            {},
            "--device #1 (rel): groups[0].paths[0].path: expected an absolute path, got 'dev/a'",
        ),
        (
            '{"name": "usb", "groups": [{"usb": [{"vendor": "zz", "product": "1"}]}]}',
            {},
            "--device #1 (usb): groups[0].usb[0].vendor: malformed USB ID 'zz'",
        ),
        (
            '{"name": "none", "groups": [{"count": 2}]}',
            {},
            "--device #1 (none): groups: no group with paths or usb: nothing to serve",
        ),
        (README_DEVICES["video"], {"domain": "Squat.AI"}, "--domain: 'Squat.AI' is not a"),
        (README_DEVICES["video"], {"listen": "8080"}, "--listen: expected [HOST]:PORT"),
        (README_DEVICES["video"], {"log_level": "loud"}, "--log-level: log level 'loud' unknown"),
    ],
)
def test_bad_flags_are_refused_in_one_line(
    device: str, flags: dict[str, str], expected: str
) -> None:
    assert refusal(device, **flags).startswith(expected)


def test_the_same_name_twice_and_no_device_are_refused() -> None:
    video = README_DEVICES["video"]
    assert refusal(video, video) == "--device #2: name: squat.ai/video is already --device #1"
    assert refusal() == "--device: at least one device must be specified"


def test_its_file_and_environment_with_its_precedence(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(
        "Domain: file.example\nlisten: 127.0.0.1:9100\nlog-level: debug\n"
        "devices:\n"
        "  - name: fuse\n    groups: [{count: 2, paths: [{path: /dev/fuse}]}]\n"
        "  - name: pico\n    groups: [{usb: [{vendor: 4617, product: '000f'}]}]\n"
    )
    assert is_gdp_data(yaml.safe_load(file.read_text()))
    from_file = load(Flags(config=str(file)), {})
    assert [r["name"] for r in from_file.data["resources"]] == [
        "file.example/fuse",
        "file.example/pico",
    ]
    # 4617 in its file is the number 0x1209.
    assert from_file.data["resources"][1]["groups"] == [
        {"usb": {"vendor": "1209", "product": "000f"}}
    ]
    assert (from_file.listen_host, from_file.listen_port, from_file.log_level) == (
        "127.0.0.1",
        9100,
        "debug",
    )
    # The environment beats the file; a flag given beats both; --device replaces the list.
    env = {"DOMAIN": "env.example", "LISTEN": ":9200", "LOG_LEVEL": "warn"}
    from_env = load(Flags(config=str(file)), env)
    assert from_env.data["resources"][0]["name"] == "env.example/fuse"
    assert (from_env.listen_port, from_env.log_level) == (9200, "warning")
    flagged = load(
        Flags(config=str(file), domain="flag.example", devices=[README_DEVICES["video"]]), env
    )
    assert [r["name"] for r in flagged.data["resources"]] == ["flag.example/video"]
    # Without --config: /etc/generic-device-plugin/config.yaml, then ./config.yaml.
    found = load(Flags(), {}, places=(str(tmp_path / "absent.yaml"), str(file)))
    assert found.source == str(file)
    file.write_text("devices: {name: fuse}\n")
    with pytest.raises(ConfigError, match=r"config.yaml: devices: expected a list of devices"):
        load(Flags(config=str(file)), {})
    assert not is_gdp_data({"resources": []})


def test_check_prints_the_devplug_config_that_serves_the_same(tmp_path: Path) -> None:
    shown = devplug("check", *(w for d in MANIFEST_DEVICES for w in ("--device", d)))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# devplug's config for the generic device plugin's")
    assert "devplug serve --config FILE --metrics-port 8080" in shown.stdout
    saved = tmp_path / "devplug.yaml"
    saved.write_text(shown.stdout)
    again = devplug("check", "--config", str(saved), "-o", "json")
    assert again.returncode == 0, again.stderr
    names = [r["name"] for r in json.loads(again.stdout)["resources"]]
    assert names == [f"squat.ai/{n}" for n in ("serial", "video", "fuse", "audio", "capture")]
    assert yaml.safe_load(shown.stdout) == load(Flags(devices=MANIFEST_DEVICES), {}).data


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["--device", '{"name": "X"}'], "--device #1: name: 'X' must match"),
        (
            ["serve", "--device", '{"name": "ab", "groups": 3}'],
            "--device #1 (ab): groups: expected a list",
        ),
        (["--log-level", "warn", "--listen", "nowhere"], "--listen: expected [HOST]:PORT"),
    ],
)
def test_a_bad_flag_stops_serve_with_one_line_and_status_2(words: list[str], expected: str) -> None:
    done = devplug(*words, "--plugin-directory", "/nonexistent")
    assert done.returncode == 2
    assert done.stderr.startswith(expected), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_its_flags_without_a_sub_command_mean_serve() -> None:
    assert _gdp_words(["--device", "x"]) == ["serve", "--device", "x"]
    assert _gdp_words(["--log-level=warn", "--config", "f"]) == [
        "--log-level=warn",
        "serve",
        "--config",
        "f",
    ]
    assert _gdp_words(["check", "--device", "x"]) == ["check", "--device", "x"]
    assert _gdp_words(["--version"]) == ["--version"]


def mknod(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def test_its_flags_serve_real_nodes_and_mounts_to_the_kubelet(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    for name in ("char0", "fuse", "snd/controlC1", "snd/pcmC1D0c", "ttyS0", "ttyUSB0", "ttyUSB1"):
        mknod(dev / name)
    (tmp_path / "share").mkdir()
    devices = {
        "char": {"groups": [{"paths": [{"path": f"{dev}/char0"}]}]},
        "fuse": {"groups": [{"count": 10, "paths": [{"path": f"{dev}/fuse"}]}]},
        "capture": {
            "groups": [
                {
                    "paths": [
                        {"path": f"{dev}/snd/controlC1", "mountPath": "/dev/snd/controlC0"},
                        {"path": f"{dev}/snd/pcmC1D0c", "mountPath": "/dev/snd/pcmC0D0c"},
                    ]
                }
            ]
        },
        "serial": {
            "groups": [
                {
                    "paths": [
                        {"path": f"{dev}/ttyS0", "optional": True},
                        {"path": f"{dev}/ttyS9", "optional": True},
                    ]
                }
            ]
        },
        "usbserial": {
            "groups": [{"paths": [{"path": f"{dev}/ttyUSB*", "mountPath": "/dev/serial/"}]}]
        },
        "share": {
            "groups": [
                {
                    "paths": [
                        {
                            "path": f"{tmp_path}/share",
                            "type": "Mount",
                            "mountPath": "/share",
                            "readOnly": True,
                        }
                    ]
                }
            ]
        },
        "video": {"groups": [{"paths": [{"path": f"{dev}/video0"}]}]},
    }
    flags = [
        w for name, d in devices.items() for w in ("--device", json.dumps({"name": name, **d}))
    ]
    names = [f"example.com/{n}" for n in devices]
    with KubeletHarness() as kubelet:
        # As its DaemonSet runs the image: the flags alone, after devplug's entry point.
        kubelet.start_command(
            cli_command(
                *flags,
                "--domain=example.com",
                f"--plugin-directory={kubelet.plugin_dir}",
                "--listen=127.0.0.1:0",
            ),
            wait_for=names,
        )
        for name, capacity, count in [
            ("char", 1, 1),
            ("fuse", 10, 10),
            ("capture", 1, 1),
            ("serial", 1, 1),
            ("usbserial", 2, 2),
            ("share", 1, 1),
            # A missing path: a device no pod can get (the generic device plugin lists none).
            ("video", 1, 0),
        ]:
            kubelet.wait_for_resource(f"example.com/{name}", capacity=capacity, count=count)
        pod = kubelet.admit(
            {n: 1 for n in names if not n.endswith("video")} | {"example.com/usbserial": 2}
        )
        assert pod.admitted, pod
        assert pod.device_nodes() == {
            f"{dev}/char0": f"{dev}/char0",
            f"{dev}/fuse": f"{dev}/fuse",
            "/dev/snd/controlC0": f"{dev}/snd/controlC1",
            "/dev/snd/pcmC0D0c": f"{dev}/snd/pcmC1D0c",
            # The optional path that is there, not the one that is missing.
            f"{dev}/ttyS0": f"{dev}/ttyS0",
            "/dev/serial/ttyUSB0": f"{dev}/ttyUSB0",
            "/dev/serial/ttyUSB1": f"{dev}/ttyUSB1",
        }
        assert {d.permissions for d in pod.options().devices} == {"mrw"}
        assert pod.mounts() == {"/share": f"{tmp_path}/share"}
        assert [m.read_only for m in pod.options().mounts] == [True]
        # /dev/fuse shared by count 10: nine more pods get it, the eleventh does not.
        for _ in range(9):
            assert kubelet.admit({"example.com/fuse": 1}).admitted
        refused = kubelet.admit({"example.com/fuse": 1})
        assert not refused.admitted
        assert refused.reason == "UnexpectedAdmissionError"


def test_its_file_alone_is_told_from_devplug_s_by_its_keys(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("devices:\n  - name: fuse\n    groups: [{paths: [{path: /dev/fuse}]}]\n")
    shown = devplug("check", "--config", str(file), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)
    assert result["config"] == str(file)
    assert result["devplugConfig"] == {
        "resources": [{"name": "squat.ai/fuse", "groups": [paths("/dev/fuse")]}]
    }
    file.write_text(
        "devices:\n  - name: fuse\n    groups: [{paths: [{path: /dev/fuse, limit: -1}]}]\n"
    )
    refused = devplug("check", "--config", str(file))
    assert refused.returncode == 2
    assert refused.stderr == (
        f"{file}: devices[0] (fuse): groups[0].paths[0].limit: expected an integer >= 0, got -1\n"
    )
