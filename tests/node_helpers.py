"""The shipped manifests on the real node: test overlays of deploy/ and its variants,
deployed and removed again, and what a test reads from the node after a restart."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from devplug.testing.realnode import RealNode

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


def deployed(node: RealNode, kustomization: Path, daemonset: str = "devplug") -> Any:
    """`RealNode.deployed` in devplug's namespace."""
    return node.deployed(kustomization, NAMESPACE, daemonset)


def daemon_pods(node: RealNode, daemonset: str = "devplug") -> list[dict[str, Any]]:
    return node.daemon_pods(NAMESPACE, daemonset)
