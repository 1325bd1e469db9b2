"""The real one-node cluster itself (node.sh through `devplug.testing.realnode`): the
node is Ready with the real kubelet, a pod runs in the real runtime, the machine-wide
lock makes runs wait their turn, and the tests skip with a how-to where it is missing."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clone_helpers import pytest_in_bare_clone

from devplug.testing.controlplane import ENV_DIR
from devplug.testing.realnode import (
    MachineLock,
    RealNode,
    klog_pid,
    klog_time,
    pod_phase,
    process_start,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_node_is_ready_and_a_busybox_pod_runs(real_node: RealNode) -> None:
    node = real_node.node()
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.2"
    assert real_node.apiserver.startswith("https://127.0.0.1:")
    with real_node.namespace("smoke") as ns:
        pod = real_node.busybox_pod(
            "hello", namespace=ns, command=("sh", "-c", "echo hello from $(hostname); sleep 3600")
        )
        real_node.create(pod)
        running = real_node.wait_pod(ns, "hello")
        assert running["spec"]["nodeName"] == real_node.node_name
        logs = real_node.kubectl("logs", "-n", ns, "hello").stdout
        assert logs.strip() == f"hello from {socket.gethostname()}"  # the host's network
        inside = real_node.kubectl("exec", "-n", ns, "hello", "--", "cat", "/proc/1/cmdline")
        assert inside.stdout.split("\0")[:2] == ["sleep", "3600"]  # sh ran it last, by exec
        done = real_node.busybox_pod("done", namespace=ns, command=("true",))
        done["spec"]["restartPolicy"] = "Never"
        real_node.create(done)
        assert real_node.wait_pod(ns, "done", pod_phase("Succeeded"))["status"]["phase"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_host_processes_of_the_node_see_the_kubelets_folder(real_node: RealNode) -> None:
    listed = real_node.exec("ls", "/var/lib/kubelet/device-plugins").stdout.split()
    assert "kubelet.sock" in listed
    # ...which the host's own /var/lib/kubelet never has: the node's is a private mount.
    assert not Path("/var/lib/kubelet/device-plugins/kubelet.sock").exists()
    pid = real_node.kubelet_pid
    lines = [line for line in real_node.kubelet_lines() if klog_pid(line) == pid]
    assert lines
    # The running kubelet's lines' times (klog's, local time) lie between its start and now.
    started = process_start(real_node.kubelet_pid)
    stamps = [t for t in map(klog_time, lines) if t is not None]
    assert stamps
    assert started - 0.05 <= min(stamps)
    assert max(stamps) <= time.time()


def holder(lock_path: Path, node_sh_lock: Path) -> subprocess.Popen[str]:
    """Another process holding the machine lock until its stdin closes."""
    code = (
        "import sys; from pathlib import Path; from devplug.testing.realnode import MachineLock\n"
        f"lock = MachineLock(Path({str(lock_path)!r}), node_sh_lock=Path({str(node_sh_lock)!r}))\n"
        "lock.acquire(timeout=5); print('held', flush=True); sys.stdin.read(); lock.release()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_machine_lock_waits_for_its_holder_and_names_it(tmp_path: Path) -> None:
    path, node_sh_lock = tmp_path / "node.lock", tmp_path / "k8s-node.lock"
    other = holder(path, node_sh_lock)
    try:
        said: list[str] = []
        with pytest.raises(TimeoutError) as timed_out:
            MachineLock(path, node_sh_lock=node_sh_lock).acquire(timeout=0.6, say=said.append)
        assert f"pid {other.pid}" in str(timed_out.value)
        assert "DEVPLUG_NODE_LOCK_TIMEOUT" in str(timed_out.value)
        assert len(said) == 1
        assert f"pid {other.pid}" in said[0]

        # Blocking: it gets the lock as soon as the holder lets go.
        lock = MachineLock(path, node_sh_lock=node_sh_lock)
        waiter = threading.Thread(target=lock.acquire, kwargs={"timeout": 30, "say": said.append})
        waiter.start()
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=10)
        waiter.join(timeout=30)
        assert lock.held
        assert f"pid {os.getpid()}" in path.read_text()
        lock.release()
    finally:
        other.kill()
        other.wait()


def test_the_machine_lock_waits_for_a_cluster_started_by_hand(tmp_path: Path) -> None:
    path, node_sh_lock = tmp_path / "node.lock", tmp_path / "k8s-node.lock"
    (tmp_path / "k8s-node.lock.dir").write_text("/tmp/by-hand\n")
    # node.sh's lock, as its `up` holds it (flocks of two opens conflict, even in one process)
    by_hand = os.open(node_sh_lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(by_hand, fcntl.LOCK_EX)
    try:
        lock = MachineLock(path, node_sh_lock=node_sh_lock)
        with pytest.raises(TimeoutError, match=r"node.sh down /tmp/by-hand"):
            lock.acquire(timeout=0.6, say=lambda _: None)
        assert not lock.held
    finally:
        os.close(by_hand)
    # The timed-out waiter let go of its own lock: the next one gets both at once.
    mine = MachineLock(path, node_sh_lock=node_sh_lock)
    with mine.holding(timeout=5):
        assert mine.held


def test_real_node_tests_skip_with_the_how_to(tmp_path: Path) -> None:
    """From a copy of the repository with no binaries beside it nor named: skipped with
    what to provide, none failed."""
    result = pytest_in_bare_clone(
        tmp_path, "tests/realnode/test_real_node.py::test_the_node_is_ready_and_a_busybox_pod_runs"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert ENV_DIR in result.stdout
    assert "kubelet.xz" in result.stdout
    assert "node.sh" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_image_of_make_image_is_in_the_nodes_containerd(
    real_node: RealNode, real_node_image: str
) -> None:
    ctr = str(real_node.bin_dir / "ctr")
    listed = real_node.exec(ctr, "-n", "k8s.io", "images", "ls", "-q").stdout.split()
    assert real_node_image in listed
