"""The shipped manifests on the real node: test overlays of deploy/ and its variants,
deployed and removed again, and what a test reads from the node after a restart."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from devplug.testing.realnode import KubeletStart, NodeHistory, RealNode, allocatable

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
NAMESPACE = "devplug-system"
# What deploy/ (the packaged default config) serves on any node.
DEFAULT_RESOURCES = {
    "devplug.io/null": 4,
    "devplug.io/zero": 1,
    "devplug.io/fake": 8,
    "devplug.io/shared": 4,
}
ROLLOUT_S = 120


def overlay(
    folder: Path, variant: str, node: RealNode | None = None, patches: tuple[str, ...] = ()
) -> Path:
    """A kustomization in `folder` over `deploy/<variant>` ("" for deploy/ itself),
    changing only what this offline one-node cluster needs. With `node`: the API
    server's address for the daemon, since the node has no kube-proxy and the
    `kubernetes` Service address leads nowhere (here it even reaches an outbound proxy
    with another certificate). `patches`: JSON 6902 patches of the DaemonSet, as YAML."""
    folder.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(DEPLOY / variant, folder)
    ops = list(patches)
    if node is not None:
        for name, value in (
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", str(node.apiserver_port)),
        ):
            ops.append(
                "- op: add\n  path: /spec/template/spec/containers/0/env/-\n"
                f"  value: {{name: {name}, value: {json.dumps(value)}}}\n"
            )
    text = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    text += f"resources:\n  - {base}\n"
    if ops:
        patch = "".join(ops).replace("\n", "\n      ")
        text += (
            "patches:\n  - target: {kind: DaemonSet}\n    patch: |\n      " + patch.rstrip() + "\n"
        )
    (folder / "kustomization.yaml").write_text(text)
    return folder


def daemon_pods(node: RealNode, daemonset: str = "devplug") -> list[dict[str, Any]]:
    """The DaemonSet's pods that are not being deleted."""
    listed = node.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout
    return [
        pod
        for pod in json.loads(listed)["items"]
        if not pod["metadata"].get("deletionTimestamp")
        and any(o["name"] == daemonset for o in pod["metadata"].get("ownerReferences") or [])
    ]


def rolled_out(node: RealNode, daemonset: str = "devplug") -> str:
    """Wait until the DaemonSet's pod is updated and Ready (`kubectl rollout status`
    watches it); its name."""
    node.kubectl(
        *("-n", NAMESPACE, "rollout", "status", f"ds/{daemonset}"),
        f"--timeout={ROLLOUT_S}s",
        timeout=ROLLOUT_S + 30,
    )
    [pod] = daemon_pods(node, daemonset)
    return str(pod["metadata"]["name"])


@contextlib.contextmanager
def deployed(node: RealNode, kustomization: Path, daemonset: str = "devplug") -> Iterator[str]:
    """`kubectl apply -k`, until its DaemonSet pod is Ready (its name is yielded);
    everything it made is deleted afterwards, waited for."""
    node.kubectl("apply", "-k", str(kustomization))
    try:
        yield rolled_out(node, daemonset)
    finally:
        node.kubectl(
            *("delete", "-k", str(kustomization), "--wait=true", "--ignore-not-found"),
            f"--timeout={ROLLOUT_S}s",
            timeout=ROLLOUT_S + 30,
        )


def whole(node_json: Mapping[str, Any], resources: Mapping[str, int]) -> bool:
    return all(allocatable(node_json, r) == n for r, n in resources.items())


def allocatable_back(
    history: NodeHistory, resources: Mapping[str, int], after: float, registered: float
) -> tuple[float, bool]:
    """When the API showed the node's allocatable whole again after `after` (a kubelet
    start, a plugin pod deleted): waits for the node's first update past `after`, and
    if it, or any later one, showed less, for the whole one that follows. With no drop
    the API never showed less, and the plugin's registration (`registered`) is when it
    was whole again. Returns the time and whether a drop was seen."""

    def settled(updates: list[tuple[float, dict[str, Any]]]) -> bool:
        later = [n for t, n in updates if t >= after]
        return bool(later) and whole(later[-1], resources)

    updates = [(t, n) for t, n in history.wait_for(settled) if t >= after]
    drops = [i for i, (_, n) in enumerate(updates) if not whole(n, resources)]
    if not drops:
        return registered, False
    return next(t for t, n in updates[drops[-1] + 1 :] if whole(n, resources)), True


def allocatable_of(node_json: Mapping[str, Any]) -> dict[str, str]:
    values = (node_json.get("status") or {}).get("allocatable") or {}
    return {k: v for k, v in values.items() if "/" in k}


def connected_once(node: RealNode, start: KubeletStart | int, resources: list[str]) -> bool:
    """Whether each resource has been dialled back by the kubelet since `start`."""
    connected = node.connected(start)
    return all(connected.get(r) for r in resources)
