"""NVIDIA's device plugin config file as a drop-in: read as NVIDIA's plugin reads it
(its defaults, its errors, its warnings; api/config/v1 and the plugin's documentation),
and the same Allocate answers and labels for the same file, against the kubelet
simulator with the fake NVML; the CDI modes with NVIDIA's naming; per-node configs
chosen by the node label, watched on a real API server."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_helpers import cli_command

from devplug.config import nvidiafile
from devplug.config.nvidia import NvidiaSpec
from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid, mig_layout, mig_uuid
from devplug.outputs.nfd import parse_features
from devplug.sources import ConfigError, parse_config
from devplug.testing import KubeletHarness
from tests.hw_helpers import validate_cdi

GPU = "nvidia.com/gpu"
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 2}
ROOT = Path(__file__).resolve().parents[2]

TIME_SLICED = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: gpu
      replicas: 4
"""


def spec_of(text: str, tmp_path: Path) -> NvidiaSpec:
    path = tmp_path / "nvidia-config.yaml"
    path.write_text(text)
    block = {"nvidiaConfig": {"file": str(path)}}
    [resource] = parse_config(yaml.safe_dump({"resources": [{"nvidia": block}]})).resources
    assert resource.nvidia is not None
    return resource.nvidia


def problem(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        spec_of(text, tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    return message.removeprefix(f"{tmp_path / 'nvidia-config.yaml'}: ")


def test_nvidia_defaults_where_the_file_is_silent(tmp_path: Path) -> None:
    """NVIDIA's plugin's flag defaults: passDeviceSpecs false, failOnInitError true,
    envvar, uuid, no MIG strategy; an empty file is its empty config."""
    for text in ("", "version: v1\n", "version: v1\nflags: {}\n"):
        spec = spec_of(text, tmp_path)
        assert spec.pass_device_specs is False
        assert spec.fail_on_init_error is True
        assert spec.device_list_strategy == ["envvar"]
        assert spec.device_id_strategy == "uuid"
        assert spec.mig_strategy == "none"
        assert spec.resource_replicas == {}
        assert spec.driver_root == "/"


def test_the_file_is_read_key_by_key(tmp_path: Path) -> None:
    spec = spec_of(
        """\
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  gdsEnabled: true
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-annotations]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
  gfd:
    machineTypeFile: /etc/machine
sharing:
  timeSlicing:
    resources:
    - {name: mig-1g.5gb, replicas: 2}
    - {name: nvidia.com/gpu, replicas: 3}
""",
        tmp_path,
    )
    assert spec.mig_strategy == "mixed"
    assert spec.fail_on_init_error is False
    assert spec.driver_root == "/run/nvidia/driver"
    assert spec.gds_enabled is True
    assert spec.pass_device_specs is True
    assert spec.device_list_strategy == ["envvar", "cdi-annotations"]
    assert spec.device_id_strategy == "index"
    assert spec.cdi_annotation_prefix == "cdi.example.com/"
    assert spec.machine_type_file == "/etc/machine"
    # Names without a domain are NVIDIA's: nvidia.com/<name>.
    assert spec.resource_replicas == {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/gpu": 3}
    assert spec.sharing == "timeSlicing"
    assert spec.rename_shared is False
    assert spec.fail_requests_greater_than_one is None  # not set: only MPS refuses
    # A string is one strategy; nvidiaDevRoot wins over nvidiaDriverRoot for nodes.
    spec = spec_of(
        "flags:\n  nvidiaDriverRoot: /a\n  nvidiaDevRoot: /b\n"
        "  plugin: {deviceListStrategy: cdi-cri}\n",
        tmp_path,
    )
    assert spec.device_list_strategy == ["cdi-cri"]
    assert spec.driver_root == "/b"


def test_mps_wins_and_refuses_more_than_one_replica(tmp_path: Path) -> None:
    spec = spec_of(
        """\
sharing:
  timeSlicing:
    resources: [{name: gpu, replicas: 8}]
  mps:
    renameByDefault: true
    resources: [{name: gpu, replicas: 2}]
flags: {mpsRoot: /run/mps}
""",
        tmp_path,
    )
    assert spec.sharing == "mps"
    assert spec.resource_replicas == {GPU: 2}
    assert spec.rename_shared is True
    assert spec.fail_requests_greater_than_one is True
    assert spec.mps.root == "/run/mps"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: v2\n", "version: unknown version 'v2': expected v1"),
        ("flags: {migStrategy: some}\n", "flags.migStrategy: expected none, single or mixed"),
        (
            "flags: {plugin: {deviceListStrategy: cdi}}\n",
            "flags.plugin.deviceListStrategy: invalid strategy 'cdi'",
        ),
        (
            "flags: {plugin: {deviceIDStrategy: serial}}\n",
            "flags.plugin.deviceIDStrategy: expected uuid or index, got 'serial'",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n",
            "sharing.timeSlicing.resources[0].replicas: number of replicas must be >= 2",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu}]}}\n",
            "sharing.timeSlicing.resources[0].replicas: required key is missing",
        ),
        (
            "sharing: {timeSlicing: {resources: []}}\n",
            "sharing.timeSlicing.resources: no resources specified",
        ),
        ("sharing: {timeSlicing: {}}\n", "sharing.timeSlicing.resources: required key is missing"),
        (
            "sharing: {mps: {resources: [{name: gpu, replicas: 2, devices: some}]}}\n",
            "sharing.mps.resources[0].devices: devices set as 'some' but the only valid string "
            "input is 'all'",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: example.com/gpu, replicas: 2}]}}\n",
            "sharing.timeSlicing.resources[0].name: ",
        ),
        (
            "flags: {deviceDiscoveryStrategy: tegra}\n",
            "flags.deviceDiscoveryStrategy: 'tegra' is not served here",
        ),
        ("flags: [1]\n", "flags: expected a mapping, got a list"),
        ("flags: {migStrategy: [\n", "invalid YAML"),
    ],
)
def test_a_bad_file_is_one_line_naming_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in problem(text, tmp_path)


def test_what_nvidia_ignores_is_ignored_with_its_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "devplug.sources.nvidia")
    spec = spec_of(
        """\
resources:
  gpus: [{pattern: "*A100*", name: a100}]
sharing:
  timeSlicing:
    resources:
    - {name: gpu, replicas: 2, rename: my-gpu, devices: [0, 1]}
""",
        tmp_path,
    )
    assert spec.resource_replicas == {GPU: 2}  # shared as nvidia.com/gpu, all devices
    text = caplog.text
    assert "customizing the 'resources' field is not supported" in text
    assert "setting the 'rename' field in sharing.timeSlicing.resources" in text
    assert "customizing the 'devices' field in sharing.timeSlicing.resources" in text


@pytest.mark.parametrize(
    ("names", "label", "default", "fallbacks", "chosen"),
    [
        (["a", "b"], "b", "a", ["named"], "b"),  # the label first
        (["a", "b"], "", "a", ["named"], "a"),  # then the default
        (["a", "default"], "", "", ["named", "single"], "default"),
        (["a"], "", "", ["named", "single"], "a"),
        (["a", "b"], "", "", ["named", "single", "empty"], ""),
    ],
)
def test_choosing_a_named_config_as_nvidias_config_manager(
    names: list[str], label: str, default: str, fallbacks: list[str], chosen: str
) -> None:
    assert nvidiafile.choose(names, label, default, fallbacks)[0] == chosen


@pytest.mark.parametrize(
    ("names", "label", "default", "expected"),
    [
        (["a"], "c", "", "the node label names config 'c', which does not exist"),
        (["a"], "", "c", "the default config 'c' does not exist"),
        (["a", "b"], "", "", "all fallbacks (named, single) failed"),
    ],
)
def test_no_config_to_choose(names: list[str], label: str, default: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        nvidiafile.choose(names, label, default, ["named", "single"])


# -- served --------------------------------------------------------------------------------


@pytest.fixture
def eight(short_tmp: Path) -> FakeGpuHost:
    return FakeGpuHost(short_tmp / "gpus", eight_gpus())


def block(host: FakeGpuHost, nvidia_file: Path, **nvidia: Any) -> dict[str, Any]:
    ref = {"file": str(nvidia_file)}
    return {"nvidia": {"hostRoot": host.host_root, **FAST, "nvidiaConfig": ref, **nvidia}}


def test_time_slicing_file_served_as_nvidia_serves_it_and_reloaded(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    nvidia_file = short_tmp / "config" / "config.yaml"
    nvidia_file.parent.mkdir()
    nvidia_file.write_text(TIME_SLICED)
    features = short_tmp / "features"
    config = {"resources": [block(eight, nvidia_file)], "nodeFeatures": {"path": str(features)}}
    process = kubelet.start_serve(config, env=eight.env, wait=False)
    kubelet.wait_for_resource("nvidia.com/gpu.shared", count=32)  # renameByDefault
    pod = kubelet.admit({"nvidia.com/gpu.shared": 1})
    [replica] = pod.devices()["nvidia.com/gpu.shared"]
    assert pod.env() == {"NVIDIA_VISIBLE_DEVICES": replica.partition("::")[0]}
    assert pod.device_nodes() == {}  # passDeviceSpecs: NVIDIA's default is false
    refused = kubelet.admit({"nvidia.com/gpu.shared": 2})
    assert not refused.admitted
    assert "failRequestsGreaterThanOne" in refused.message
    kubelet.wait_until(features.exists, what="the feature file")
    labels = parse_features(features.read_text())
    # GFD: labels under the resource's own name; a renamed one is not -SHARED.
    keys = ("product", "replicas", "sharing-strategy", "count")
    assert {k: labels[f"nvidia.com/gpu.{k}"] for k in keys} == {
        "product": "NVIDIA-H100-80GB-HBM3",
        "replicas": "4",
        "sharing-strategy": "time-slicing",
        "count": "8",
    }

    # The ConfigMap changes: the new file is served, as after NVIDIA's SIGHUP restart.
    nvidia_file.write_text(TIME_SLICED.replace("renameByDefault: true", "renameByDefault: false"))
    kubelet.wait_for_resource(GPU, count=32)
    kubelet.wait_until(
        lambda: not kubelet.device_ids("nvidia.com/gpu.shared", healthy=True),
        what="the renamed resource gone",  # its plugin stopped: the kubelet's devices go
    )
    kubelet.wait_until(
        lambda: (
            parse_features(features.read_text()).get("nvidia.com/gpu.product")
            == "NVIDIA-H100-80GB-HBM3-SHARED"
        ),
        what="the shared product label",
    )
    # A bad file is refused in one line; what was served keeps serving.
    nvidia_file.write_text(TIME_SLICED.replace("replicas: 4", "replicas: 1"))
    kubelet.wait_until(
        lambda: "number of replicas must be >= 2" in process.output, what="the refusal"
    )
    assert "config reload refused, the previous config keeps serving" in process.output
    assert len(kubelet.device_ids(GPU, healthy=True)) == 32


def test_index_ids_mig_and_volume_mounts(kubelet: KubeletHarness, short_tmp: Path) -> None:
    host = FakeGpuHost(short_tmp / "mig", mig_layout())
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text(
        "version: v1\nflags:\n  migStrategy: mixed\n  gdsEnabled: true\n  plugin:\n"
        "    deviceListStrategy: volume-mounts\n    deviceIDStrategy: index\n"
        "    passDeviceSpecs: true\n"
    )
    kubelet.start_serve({"resources": [block(host, nvidia_file)]}, env=host.env, wait=False)
    kubelet.wait_for_resource("nvidia.com/mig-3g.20gb", count=1)
    pod = kubelet.admit({"nvidia.com/mig-3g.20gb": 1})
    assert pod.devices()["nvidia.com/mig-3g.20gb"] == [mig_uuid(1, 2)]  # IDs stay UUIDs
    # The container gets NVIDIA's index form: GPU 1, MIG device slot 0.
    assert pod.env() == {
        "NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices",
        "NVIDIA_GDS": "enabled",
    }
    assert pod.mounts() == {"/var/run/nvidia-container-devices/1:0": "/dev/null"}
    assert "/dev/nvidia1" in pod.device_nodes()
    whole = kubelet.admit({GPU: 1})
    assert whole.mounts() == {"/var/run/nvidia-container-devices/2": "/dev/null"}


def cdi_spec(folder: Path) -> dict[str, Any]:
    """devplug's spec in `folder`, checked against the CDI spec's JSON schema."""
    [path] = folder.glob("*.json")
    body: dict[str, Any] = json.loads(path.read_text())
    validate_cdi(body)
    return body


def test_cdi_annotations_only_sends_no_env_and_no_device_specs(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    cdi_dir = short_tmp / "cdi"
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text(
        "flags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n    passDeviceSpecs: true\n"
    )
    # The host's spec knows no device of these GPUs: devplug's devices get their nodes.
    host_specs = Path(eight.host_root) / "etc" / "cdi"  # where nvidia-ctk writes it
    host_specs.mkdir(parents=True)
    (host_specs / "nvidia.yaml").write_text(
        yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []})
    )
    entry = block(eight, nvidia_file, cdiDir=str(cdi_dir))
    kubelet.start_serve({"resources": [entry]}, env=eight.env, wait=False)
    kubelet.wait_for_resource(GPU, count=8)
    first, second = kubelet.admit({GPU: 1}), kubelet.admit({GPU: 1})
    [uuid] = first.devices()[GPU]
    assert first.env() == {}
    assert first.device_nodes() == {}
    assert first.cdi_devices() == []
    [(key, value)] = first.annotations().items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
    assert value == f"k8s.device-plugin.nvidia.com/gpu={uuid}"
    assert set(second.annotations()).isdisjoint(first.annotations())  # one ID per answer
    # devplug's spec: every GPU by its UUID, with its device node.
    kubelet.wait_until(lambda: any(cdi_dir.glob("*.json")), what="the CDI spec")
    spec = cdi_spec(cdi_dir)
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert sorted(devices) == sorted(gpu_uuid(i) for i in range(8))
    index = int(uuid.split("-")[1], 16)
    assert devices[uuid]["deviceNodes"][0]["path"] == f"/dev/nvidia{index}"


def test_cdi_only_without_the_hosts_nvidia_spec_is_refused_in_one_line(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    """Without `nvidia-ctk`'s spec a CDI-only container would get the device nodes and
    no driver libraries: refused, saying which mode, where it looked and what to do."""
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text("flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n")
    entry = block(eight, nvidia_file, cdiSpecDirs=[str(short_tmp / "none")])
    process = kubelet.start_serve({"resources": [entry]}, env=eight.env, wait=False)
    assert process.wait(timeout=60) == 1
    [line] = [w for w in process.output.splitlines() if "CDI spec" in w]
    assert "deviceListStrategy cdi-cri alone needs the host's NVIDIA CDI spec" in line
    assert "add envvar to deviceListStrategy" in line


def test_cdi_cri_with_the_hosts_nvidia_spec(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path
) -> None:
    """The host's `nvidia-ctk cdi generate` spec gives each device its edits and the
    spec its common ones (libraries, hooks); the container is named devplug's kind."""
    host_cdi = Path(eight.host_root) / "etc" / "cdi"
    host_cdi.mkdir(parents=True)
    hook = {
        "hookName": "createContainer",
        "path": "/usr/bin/nvidia-cdi-hook",
        "args": ["nvidia-cdi-hook", "update-ldcache"],
    }
    host_spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
            for i in range(8)
        ]
        + [{"name": "all", "containerEdits": {}}],
        "containerEdits": {
            "hooks": [hook],
            "mounts": [
                {
                    "hostPath": "/usr/lib/libcuda.so.550",
                    "containerPath": "/usr/lib/libcuda.so.550",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }
    (host_cdi / "nvidia.yaml").write_text(yaml.safe_dump(host_spec))
    cdi_dir = short_tmp / "cdi"
    nvidia_file = short_tmp / "nvidia.yaml"
    nvidia_file.write_text(
        "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-cri]\n"
        "    deviceIDStrategy: index\n"
    )
    kubelet.start_serve(
        {"resources": [block(eight, nvidia_file, cdiDir=str(cdi_dir))]}, env=eight.env, wait=False
    )
    kubelet.wait_for_resource(GPU, count=8)
    pod = kubelet.admit({GPU: 1})
    [uuid] = pod.devices()[GPU]
    index = str(int(uuid.split("-")[1], 16))
    assert pod.cdi_devices() == [f"k8s.device-plugin.nvidia.com/gpu={index}"]
    assert pod.env() == {"NVIDIA_VISIBLE_DEVICES": index}  # envvar too: not CDI only
    assert pod.annotations() == {}
    kubelet.wait_until(lambda: any(cdi_dir.glob("*.json")), what="the CDI spec")
    spec = cdi_spec(cdi_dir)
    assert spec["cdiVersion"] == "0.6.0"  # devplug's, newer than the host's
    assert spec["containerEdits"] == host_spec["containerEdits"]
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert devices[index] == {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}


def serve_command(kubelet: KubeletHarness, path: Path, *extra: str) -> list[str]:
    return cli_command(
        "serve", "--nvidia-config", str(path), "--plugin-dir", str(kubelet.plugin_dir), *extra
    )


def test_fail_on_init_error_as_nvidia(kubelet: KubeletHarness, short_tmp: Path) -> None:
    host = FakeGpuHost(short_tmp / "gpus", eight_gpus())
    host.set_driver(loaded=False)
    empty = short_tmp / "empty.yaml"
    empty.write_text("")  # NVIDIA's defaults: failOnInitError true
    result = subprocess.run(
        serve_command(kubelet, empty),
        env={**_env(), **host.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("devplug serve: nvidia.com/gpu: NVML is not usable: ")
    assert "failOnInitError" in line
    assert "Traceback" not in result.stderr
    # failOnInitError false: served with no GPUs, NVML tried again (NVIDIA: "waiting").
    waiting = short_tmp / "waiting.yaml"
    waiting.write_text("flags: {failOnInitError: false}\n")
    kubelet.start_command(serve_command(kubelet, waiting), env=host.env, wait_for=GPU)
    kubelet.wait_for_resource(GPU, count=0, capacity=0)
    host.set_driver(loaded=True)
    kubelet.wait_for_resource(GPU, count=8)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


# -- per-node configs, the node label watched on a real API server -----------------------------


def test_the_node_label_picks_the_config_and_a_change_applies_in_place(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path, kubeconfig: str
) -> None:
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    node = "gpu-node-1"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    label = "nvidia.com/device-plugin.config"
    try:
        # A ConfigMap of named configs, as NVIDIA's chart mounts it (its '..' entries too).
        folder = short_tmp / "available-configs"
        folder.mkdir()
        (folder / "..data").mkdir()
        (folder / "default").write_text("version: v1\n")
        (folder / "sliced").write_text(TIME_SLICED.replace("    renameByDefault: true\n", ""))
        command = serve_command(kubelet, folder, "--node-name", node, "--kubeconfig", kubeconfig)
        process = kubelet.start_command(command, env=eight.env, wait_for=GPU)
        kubelet.wait_for_resource(GPU, count=8)  # no label: the config named 'default'
        assert "NVIDIA config" in process.output
        assert "the one named 'default'" in process.output

        core.patch_node(node, {"metadata": {"labels": {label: "sliced"}}})
        kubelet.wait_for_resource(GPU, count=32)  # applied in place, same process
        assert process.running

        core.patch_node(node, {"metadata": {"labels": {label: "missing"}}})
        kubelet.wait_until(
            lambda: "names config 'missing', which does not exist" in process.output,
            what="the refusal of a label naming no config",
        )
        assert len(kubelet.device_ids(GPU, healthy=True)) == 32  # still served

        core.patch_node(node, {"metadata": {"labels": {label: None}}})
        kubelet.wait_for_resource(GPU, count=8)
    finally:
        core.delete_node(node)
        api.close()


def test_a_labelled_node_starts_with_its_config_where_no_fallback_applies(
    kubelet: KubeletHarness, eight: FakeGpuHost, short_tmp: Path, kubeconfig: str
) -> None:
    """Named configs with no 'default' and no default set: an unlabelled node has none
    (NVIDIA's config manager fails there too), a labelled one starts with its own; the
    label is read before any config is chosen, so the log names only that one."""
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    node = "gpu-node-2"
    label = "nvidia.com/device-plugin.config"
    core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {label: "b"}}}
    )
    try:
        folder = short_tmp / "available-configs"
        folder.mkdir()
        (folder / "a").write_text("version: v1\n")
        (folder / "b").write_text(TIME_SLICED.replace("    renameByDefault: true\n", ""))
        command = serve_command(kubelet, folder, "--node-name", node, "--kubeconfig", kubeconfig)
        process = kubelet.start_command(command, env=eight.env, wait_for=GPU)
        kubelet.wait_for_resource(GPU, count=32)
        chosen = [line for line in process.output.splitlines() if "NVIDIA config" in line]
        assert len(chosen) == 1, chosen
        assert f"NVIDIA config 'b' ({folder / 'b'}): named by the node label {label}" in chosen[0]
        process.stop()
        # A node that cannot be read: one line, exit 1, before anything is served.
        gone = serve_command(
            kubelet, folder, "--node-name", "no-such-node", "--kubeconfig", kubeconfig
        )
        result = subprocess.run(
            gone, env={**_env(), **eight.env}, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1
        assert result.stderr.splitlines()[-1] == (
            f"devplug serve: {label}: cannot read node no-such-node: 404 Not Found"
        )
        assert "Traceback" not in result.stderr
    finally:
        core.delete_node(node)
        api.close()
