"""NVIDIA's device plugin started as NVIDIA's chart starts it: the command
`nvidia-device-plugin` with the environment the chart renders from its values (its
templates/daemonset-device-plugin.yml), flags over variables over the config file, as
in NVIDIA's cmd/nvidia-device-plugin and api/config/v1; served by devplug to the
kubelet simulator on the fake NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devplug.cli.nvidia_plugin import serve_argv
from devplug.config.nvidiaflags import FlagError, resolve
from devplug.fakes.gpus import mig_layout
from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid
from devplug.testing import KubeletHarness

# What NVIDIA's chart renders for `helm install --set migStrategy=mixed
# --set compatWithCPUManager=true --set deviceListStrategy=envvar` with a config map:
# MPS_ROOT always (mps.root), the others where their value is set.
CHART_ENV = {
    "MPS_ROOT": "/run/nvidia/mps",
    "MIG_STRATEGY": "mixed",
    "PASS_DEVICE_SPECS": "true",
    "DEVICE_LIST_STRATEGY": "envvar",
    "CONFIG_FILE": "/config/config.yaml",
    "NVIDIA_MIG_MONITOR_DEVICES": "all",
}


def test_the_charts_variables_become_the_files_keys() -> None:
    resolved = resolve([], CHART_ENV)
    assert resolved.config_file == "/config/config.yaml"
    assert resolved.overrides == {
        "flags": {
            "mpsRoot": "/run/nvidia/mps",
            "migStrategy": "mixed",
            "plugin": {"passDeviceSpecs": True, "deviceListStrategy": ["envvar"]},
        }
    }


def test_a_flag_wins_over_its_variable_and_aliases_are_one_flag() -> None:
    resolved = resolve(
        ["--mig-strategy=single", "--nvidia-driver-root", "/run/nvidia/driver", "--gds-enabled"],
        {"MIG_STRATEGY": "mixed", "NVIDIA_DRIVER_ROOT": "/"},
    )
    flags = resolved.overrides["flags"]
    assert (flags["migStrategy"], flags["nvidiaDriverRoot"], flags["gdsEnabled"]) == (
        "single",
        "/run/nvidia/driver",
        True,
    )


def test_lists_split_on_commas_and_repeat_as_in_nvidias_flags_library() -> None:
    resolved = resolve(
        ["--device-list-strategy", "envvar", "--device-list-strategy=cdi-cri"],
        {"DEVICE_LIST_STRATEGY": "volume-mounts", "IMEX_CHANNEL_IDS": "0"},
    )
    assert resolved.overrides["flags"]["plugin"]["deviceListStrategy"] == ["envvar", "cdi-cri"]
    assert resolved.overrides["imex"] == {"channelIDs": [0]}
    assert resolve([], {"DEVICE_LIST_STRATEGY": "envvar,cdi-annotations"}).overrides["flags"][
        "plugin"
    ]["deviceListStrategy"] == ["envvar", "cdi-annotations"]


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--mig-stratgy=mixed"], {}, "--mig-stratgy=mixed: not a flag of NVIDIA's device plugin"),
        (
            [],
            {"FAIL_ON_INIT_ERROR": "yes"},
            "FAIL_ON_INIT_ERROR: expected true or false, got 'yes'",
        ),
        (["--imex-channel-ids=a"], {}, "--imex-channel-ids: expected integers"),
        (["--config-file"], {}, "--config-file: expected a value"),
    ],
)
def test_what_nvidia_refuses_is_one_line(
    argv: list[str], environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(FlagError, match="^" + expected.replace("(", r"\(")):
        resolve(argv, environ)


def test_the_kubelet_socket_names_the_plugin_folder() -> None:
    argv = serve_argv(["--kubelet-socket", "/k/dp/kubelet.sock"], {})
    assert argv[:3] == ["serve", "--plugin-dir", "/k/dp"]
    assert json.loads(argv[argv.index("--nvidia-flags") + 1]) == {"version": "v1"}


def test_a_bad_variable_exits_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devplug.cli.nvidia_plugin"],
        env={"MIG_STRATEGY": "mixed", "PASS_DEVICE_SPECS": "maybe", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "nvidia-device-plugin: PASS_DEVICE_SPECS: expected true or false, got 'maybe'"
    ]


def test_the_charts_environment_serves_as_nvidias_plugin_over_its_config_file(
    kubelet: KubeletHarness, short_tmp: Path
) -> None:
    host = FakeGpuHost(short_tmp / "mig", mig_layout())
    config = short_tmp / "config.yaml"
    # The file says none and no device specs; the chart's variables say otherwise and win.
    config.write_text(
        "version: v1\nflags:\n  migStrategy: none\n  plugin:\n    passDeviceSpecs: false\n"
    )
    env = {
        **host.env,
        **CHART_ENV,
        "CONFIG_FILE": str(config),
        "DEVPLUG_NVIDIA_OPTIONS": json.dumps({"hostRoot": host.host_root}),
    }
    kubelet.start_module(
        "devplug.cli.nvidia_plugin",
        "--kubelet-socket",
        str(kubelet.plugin_dir / "kubelet.sock"),
        env=env,
    )
    kubelet.wait_for_resource("nvidia.com/mig-3g.20gb", count=1)
    kubelet.wait_for_resource("nvidia.com/gpu", count=1)  # GPU 2, MIG off
    pod = kubelet.admit({"nvidia.com/gpu": 1})
    assert pod.env() == {"NVIDIA_VISIBLE_DEVICES": gpu_uuid(2)}
    assert "/dev/nvidia2" in pod.device_nodes()  # PASS_DEVICE_SPECS=true


@pytest.mark.timeout(240)
def test_the_charts_config_manager_and_plugin_follow_the_node_label(
    kubelet: KubeletHarness, short_tmp: Path, kubeconfig: str
) -> None:
    """NVIDIA's chart with a config map: `config-manager` once (ONESHOT) before the plugin,
    `nvidia-device-plugin` on CONFIG_FILE, and `config-manager` beside it, which points
    the file at the config the node label names and signals the plugin (SIGHUP)."""
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    node = "chart-node-1"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    label = "nvidia.com/device-plugin.config"
    try:
        host = FakeGpuHost(short_tmp / "gpus", eight_gpus())
        available = short_tmp / "available-configs"
        available.mkdir()
        (available / "default").write_text("version: v1\n")
        (available / "sliced").write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, replicas: 2}\n"
        )
        config = short_tmp / "config" / "config.yaml"
        config.parent.mkdir()
        manager_env = {
            **os.environ,
            "KUBECONFIG": kubeconfig,
            "NODE_NAME": node,
            "NODE_LABEL": label,
            "CONFIG_FILE_SRCDIR": str(available),
            "CONFIG_FILE_DST": str(config),
            "DEFAULT_CONFIG": "",
            "FALLBACK_STRATEGIES": "named,single",
            "SEND_SIGNAL": "false",
            "ONESHOT": "true",
        }
        manager = [sys.executable, "-m", "devplug.cli.nvidia_config_manager"]
        init = subprocess.run(manager, env=manager_env, capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        assert os.path.realpath(config) == str(available / "default")

        env = {
            **host.env,
            "CONFIG_FILE": str(config),
            "DEVPLUG_NVIDIA_OPTIONS": json.dumps({"hostRoot": host.host_root}),
        }
        plugin = kubelet.start_module(
            "devplug.cli.nvidia_plugin",
            "--kubelet-socket",
            str(kubelet.plugin_dir / "kubelet.sock"),
            env=env,
        )
        kubelet.wait_for_resource("nvidia.com/gpu", count=8)
        sidecar = kubelet.start_command(
            manager,
            name="config-manager",
            env={
                **manager_env,
                "ONESHOT": "false",
                "SEND_SIGNAL": "true",
                "PROCESS_TO_SIGNAL": "devplug.cli.nvidia_plugin",
            },
        )
        kubelet.wait_until(
            lambda: "already configured" in sidecar.output,
            timeout=90,  # the Kubernetes client's import first
            what="the sidecar's first look",
        )
        core.patch_node(node, {"metadata": {"labels": {label: "sliced"}}})
        kubelet.wait_until(lambda: "sent signal 1" in sidecar.output, timeout=60, what="a signal")
        kubelet.wait_for_resource("nvidia.com/gpu", count=16, timeout=60)  # reloaded in place
        assert os.path.realpath(config) == str(available / "sliced")
        assert plugin.running
        assert sidecar.running
    finally:
        core.delete_node(node)
        api.close()


def test_config_manager_refuses_empty_settings_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devplug.cli.nvidia_config_manager"],
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "n"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "config-manager: invalid <config-file-srcdir>: must not be empty string"
    )
